"""Exactly one scheduler acts at a time: a lease in Redis with a fencing token.

``{prefix}:scheduler:leader`` holds ``"<holder> <token>"`` with a time to live; a
scheduler that holds it renews it each evaluation, one that does not tries to take it
when it has expired. Taking it increments ``{prefix}:scheduler:fence``, so every
term of leadership has a larger token than the one before. The scheduler records the
token with every decision and checks, atomically, that its term still holds right
before each action (:meth:`Leadership.holds`): a scheduler that was paused past its
lease (a long GC, a frozen VM) and wakes up finds a newer token there and does
nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

# KEYS: lease, fence. ARGV: holder, ttl ms. Returns the token held, or false.
_ACQUIRE = """
local current = redis.call('GET', KEYS[1])
if current then
    local holder, token = string.match(current, '^(%S+) (%d+)$')
    if holder == ARGV[1] then
        redis.call('PEXPIRE', KEYS[1], ARGV[2])
        return tonumber(token)
    end
    return false
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. token, 'PX', ARGV[2])
return token
"""
# KEYS: lease. ARGV: "holder token". 1 if that term still holds.
_HOLDS = "return redis.call('GET', KEYS[1]) == ARGV[1] and 1 or 0"
# KEYS: lease. ARGV: "holder token". Deletes the lease only if it is that term's.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


@dataclass(frozen=True, slots=True)
class Term:
    holder: str
    token: int

    @property
    def value(self) -> str:
        return f"{self.holder} {self.token}"


class Leadership:
    """One scheduler's claim on leadership (``holder`` names it: host and pid)."""

    def __init__(self, client: redis.Redis, prefix: str, holder: str, ttl_seconds: float) -> None:
        if not holder or any(c.isspace() for c in holder):
            raise ValueError(f"holder must be a non-empty word, got {holder!r}")
        self.client = client
        self.lease_key = f"{prefix}:scheduler:leader"
        self.fence_key = f"{prefix}:scheduler:fence"
        self.holder = holder
        self.ttl_ms = max(1, round(ttl_seconds * 1000))
        self._acquire = client.register_script(_ACQUIRE)
        self._holds = client.register_script(_HOLDS)
        self._release = client.register_script(_RELEASE)

    def acquire(self) -> Term | None:
        """Take or renew the lease; the term held, or None while another holds it."""
        token = self._acquire(
            keys=[self.lease_key, self.fence_key], args=[self.holder, self.ttl_ms]
        )
        return Term(self.holder, int(token)) if token else None

    def holds(self, term: Term) -> bool:
        """Whether ``term`` is still the current one (checked in Redis, atomically)."""
        return bool(self._holds(keys=[self.lease_key], args=[term.value]))

    def current(self) -> str | None:
        """Who holds the lease now (``"<holder> <token>"``), for operators."""
        value = self.client.get(self.lease_key)
        return value.decode() if isinstance(value, bytes) else value

    def release(self, term: Term) -> None:
        """Give the lease up (a clean stop), so another scheduler need not wait."""
        self._release(keys=[self.lease_key], args=[term.value])
