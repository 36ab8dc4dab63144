"""API-key authentication for the HTTP API, with a short in-memory cache.

A successful authentication is remembered for ``ttl`` seconds (30 by default)
so the submit path does not pay a database round trip per request. The price:
a revoked key keeps working on a running server for at most ``ttl`` seconds (a job's
event stream it opened ends at its next keep-alive, which asks the record itself).
Only successes are cached, the cache holds at most ``max_entries`` keys (the
least recently used go first), and it is keyed by a digest of the key, never
the key itself.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from sqlalchemy import Engine

from hypermedia.accounts import Caller, authenticate
from hypermedia.db.engine import snapshot


def _digest(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


class Authenticator:
    def __init__(
        self,
        engine: Engine,
        *,
        ttl: float = 30.0,
        max_entries: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        self._cache: OrderedDict[str, tuple[Caller, float]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, api_key: str) -> Caller:
        """The caller behind ``api_key``; AuthenticationFailed for any bad key."""
        cached = self.cached(api_key)
        if cached is not None:
            return cached
        with snapshot(self.engine) as conn:
            caller = authenticate(conn, api_key)
        if self.ttl > 0:
            expires = self._clock() + self.ttl
            with self._lock:
                digest = _digest(api_key)
                self._cache[digest] = (caller, expires)
                self._cache.move_to_end(digest)
                while len(self._cache) > self.max_entries:
                    self._cache.popitem(last=False)
        return caller

    def cached(self, api_key: str) -> Caller | None:
        """The caller if this key authenticated less than ``ttl`` seconds ago."""
        if self.ttl <= 0:
            return None
        digest = _digest(api_key)
        with self._lock:
            hit = self._cache.get(digest)
            if hit is None:
                return None
            caller, expires = hit
            if self._clock() >= expires:
                del self._cache[digest]
                return None
            self._cache.move_to_end(digest)
            return caller

    def forget(self) -> None:
        """Drop every cached authentication (e.g. after revoking keys)."""
        with self._lock:
            self._cache.clear()

    def __len__(self) -> int:
        return len(self._cache)
