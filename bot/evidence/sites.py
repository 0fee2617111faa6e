"""How a message names the sites its evidence came from (enrichment.*.sites): a leaf, so a renderer names them
without loading the enrichers."""

from __future__ import annotations

from collections.abc import Iterable


def sites_text(names: Iterable[str]) -> str:
    """`sites a, b and c`, `site a`; each site once, in order of name; nothing for no site (the default source's
    alerts have none)."""
    sites = sorted({name for name in names if name})
    if not sites:
        return ""
    if len(sites) == 1:
        return f"site {sites[0]}"
    return f"sites {', '.join(sites[:-1])} and {sites[-1]}"
