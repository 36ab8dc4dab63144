"""Rate limits on Redis, kept by the `limits` library (moving windows, Lua on Redis).

One :class:`RateLimiter` per stack, on the stack's Redis client (its connection pool),
with keys under ``{prefix}:ratelimit`` (:mod:`hypermedia.queue.keys`). A limit is a
number of events per minute for one identity (an API key's submits, a user's
uploads); :meth:`RateLimiter.hit` counts ``cost`` events and raises
:class:`~hypermedia.errors.RateLimited` with ``retry_after_seconds`` when they do not
fit. A limit of 0 means none (nothing is counted).

When Redis cannot be reached the limit is not enforced (logged): submits stay
possible during a Redis outage, as the job record allows, and credits, quotas and
priority ranges still bound what a caller can do.

Every process that opens a stack makes one (the actors, ``status``, ``db upgrade``);
few count anything (the API). So `limits` (~0.03 CPU-s of imports, its asyncio
storages with it) is imported at the first :meth:`RateLimiter.hit`.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING

import redis

from hypermedia.errors import RateLimited
from hypermedia.queue.keys import rate_limit_prefix

if TYPE_CHECKING:
    from limits.strategies import MovingWindowRateLimiter

log = logging.getLogger(__name__)


class RateLimiter:
    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self._client = client
        self._prefix = prefix
        self._window: MovingWindowRateLimiter | None = None

    @property
    def _limiter(self) -> MovingWindowRateLimiter:
        if self._window is None:
            from limits.storage import RedisStorage
            from limits.strategies import MovingWindowRateLimiter

            storage = RedisStorage(
                "redis://",  # not dialled: the client's own pool is used
                connection_pool=self._client.connection_pool,
                key_prefix=rate_limit_prefix(self._prefix),
            )
            self._window = MovingWindowRateLimiter(storage)
        return self._window

    def hit(self, what: str, identity: str, per_minute: int, cost: int = 1) -> None:
        """Count ``cost`` events of ``what`` for ``identity``; RateLimited past
        ``per_minute`` in the last minute (then nothing is counted)."""
        if per_minute <= 0 or cost <= 0:
            return
        from limits import RateLimitItemPerMinute

        item = RateLimitItemPerMinute(per_minute)
        try:
            if self._limiter.hit(item, what, identity, cost=cost):
                return
            reset_at = self._limiter.get_window_stats(item, what, identity).reset_time
        except redis.RedisError as exc:
            log.warning(
                "rate limit %s not enforced: redis unavailable (%s)",
                what,
                exc,
                extra={"action": "rate_limit_unenforced"},
            )
            return
        wait = max(1, math.ceil(reset_at - time.time()))
        raise RateLimited(
            f"too many {what}s: at most {per_minute} a minute; retry in {wait} s",
            limit_per_minute=per_minute,
            retry_after_seconds=wait,
        )
