"""Who may approve remediation by the configuration's lists; Slack actors are judged by their Slack role instead
(SlackAuthorizer in bot/interact/remediation.py, which falls back on these lists for the others)."""

from __future__ import annotations

from bot.action_catalog import ACTIONS
from bot.config import RemediationConfig


class ConfigAuthorizer:
    """Approvers and admins listed in `remediation.approvers` / `remediation.admins` (actor ids such as
    `cli:alice` or `slack:U024BE7LH`). Dangerous actions need an admin."""

    def __init__(self, config: RemediationConfig) -> None:
        self._approvers = frozenset(config.approvers)
        self._admins = frozenset(config.admins)

    async def may_approve(self, actor: str, action: str) -> bool:
        if ACTIONS[action].safety == "dangerous":
            return actor in self._admins
        return actor in self._approvers or actor in self._admins

    async def is_admin(self, actor: str) -> bool:
        return actor in self._admins
