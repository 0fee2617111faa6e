"""Who may do what: Slack user ids and user groups map to roles, each command to the least role it needs.

Roles are ordered from least to most powerful (as configured); a role may do what every role before it may.
User group members are read from Slack (usergroups.users.list) and kept for `group_cache`; when Slack cannot
say, the group counts as empty: access fails closed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from bot.clock import Clock
from bot.config import InteractivityConfig
from bot.render.slack import escape

log = logging.getLogger(__name__)

# group id -> its members' user ids (raises on failure)
GroupMembers = Callable[[str], Awaitable[list[str]]]


class Access:
    def __init__(self, config: InteractivityConfig, members: GroupMembers, clock: Clock) -> None:
        self._roles = config.roles
        self._permissions = config.effective_permissions
        self._members = members
        self._clock = clock
        self._cache_for = config.group_cache
        self._cache: dict[str, tuple[float, frozenset[str]]] = {}

    def required_role(self, permission: str, default: str) -> str:
        return self._permissions.get(permission, default)

    def needs(self, permission: str, default: str) -> str:
        """Why someone without the permission is refused, in words fit to show them (mrkdwn, escaped)."""
        role = escape(self.required_role(permission, default))
        if any(configured.name == self.required_role(permission, default) for configured in self._roles):
            return f"the {role} role"
        return f"the {role} role, and no {role} role is configured: nobody may use it (see interactivity.roles)"

    async def allowed(self, user_id: str, permission: str, default_role: str) -> bool:
        """Whether the user holds the role this permission needs (or a later one). An unknown role: nobody."""
        needed = self.required_role(permission, default_role)
        names = [role.name for role in self._roles]
        if needed not in names:
            return False
        return await self.rank(user_id) >= names.index(needed)

    async def rank(self, user_id: str) -> int:
        """The position of the user's most powerful role, -1 for none."""
        for position in range(len(self._roles) - 1, -1, -1):
            role = self._roles[position]
            if user_id in role.users:
                return position
            for group in role.groups:
                if user_id in await self._group(group):
                    return position
        return -1

    async def _group(self, group_id: str) -> frozenset[str]:
        now = self._clock.monotonic()
        cached = self._cache.get(group_id)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            members = frozenset(await self._members(group_id))
        except Exception as exc:  # the Web API's failure, whatever its kind: nobody gains access by it
            log.warning("cannot read a Slack user group", extra={"group": group_id, "reason": str(exc)})
            return cached[1] if cached is not None else frozenset()
        self._cache[group_id] = (now + self._cache_for, members)
        return members
