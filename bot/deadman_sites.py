"""The dead man's switch per site: each site's Prometheus gives its Watchdog its external labels (`site`,
`cluster`: `deadman.site_labels`), and each site's Watchdog is expected on its own, whichever Alertmanagers bring
it.

Two kinds of row in the store's Watchdog timers, beside those of the Alertmanagers:
- a site's timer, `site site=b` (its labels, URL-encoded after `site `), restarted by each Watchdog of that site;
- a path, `path <externalURL> site=b`, restarted by each Watchdog of that site that Alertmanager brought: it names
  the Alertmanagers of the site in its alert, and tells the switch that an Alertmanager silent with its site is
  told by the site's alert, not by one of its own. A path never alerts.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Collection, Iterable, Mapping, Sequence

SITE = "site "
PATH = "path "


def site_key(labels: Mapping[str, str], names: Sequence[str]) -> str | None:
    """The site timer of a Watchdog with these labels: those of `names` it carries, or None without any."""
    present = [(name, labels[name]) for name in names if labels.get(name)]
    return SITE + urllib.parse.urlencode(present) if present else None


def path_key(replica: str, site: str) -> str:
    return f"{PATH}{replica} {site.removeprefix(SITE)}"


def is_site(key: str) -> bool:
    return key.startswith(SITE)


def is_path(key: str) -> bool:
    return key.startswith(PATH)


def site_labels(key: str) -> dict[str, str]:
    """The labels a site's timer was recorded for (put on its WatchdogMissing alert)."""
    return dict(urllib.parse.parse_qsl(key.removeprefix(SITE), keep_blank_values=True))


def display(key: str) -> str:
    """`site b`, or `site b/gpu-1` for a site named by two labels; other keys as they are."""
    return SITE + "/".join(site_labels(key).values()) if is_site(key) else key


def paths(keys: Iterable[str]) -> dict[str, set[str]]:
    """Each site's timer, and the Alertmanagers (externalURLs) that brought its Watchdog."""
    found: dict[str, set[str]] = {}
    for key in keys:
        if is_path(key):
            replica, _, site = key.removeprefix(PATH).partition(" ")
            found.setdefault(SITE + site, set()).add(replica)
    return found


def explained(missing: Collection[str], sites: Mapping[str, set[str]]) -> set[str]:
    """The Alertmanagers among `missing` whose every site is missing too: their silence is their sites'."""
    replicas = {replica for brought in sites.values() for replica in brought} & set(missing)
    return {
        replica for replica in replicas if all(site in missing for site, brought in sites.items() if replica in brought)
    }
