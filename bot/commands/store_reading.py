"""Commands that read the bot's store (`gpus`, `audit`) when no store is named."""

from __future__ import annotations

import sys

from bot.config import BotConfig


def no_store_here(config: BotConfig, *, named: bool) -> bool:
    """True once it said so: given neither --config nor --store (`named`), the store is the default file in the
    working directory, and there is none. Said instead of only that the store cannot be opened: the user is
    probably not in the bot's folder, and the bot's store is named by its configuration."""
    if named or config.store.path.exists():
        return False
    print(
        f"no store in this folder ({config.store.path.resolve()}): pass --config with the bot's configuration file, "
        "or --store with its store file",
        file=sys.stderr,
    )
    return True
