"""Priority queues in Redis with leases and a delayed set.

Contract (what the rest of the platform may rely on):

* ``enqueue`` puts jobs in ``ready``; ``claim`` pops by priority (1 first) then
  age and records a lease with a deadline; a job is in at most one of ready /
  leased / delayed (see :mod:`hypermedia.queue.keys`).
* A job taken off as ended (:meth:`RedisQueue.remove`) leaves a tombstone for at
  least :data:`~hypermedia.queue.keys.ENDED_KEPT_SECONDS`, and no push (``enqueue``,
  ``delay``, ``restore``) puts it back meanwhile: a caller that read the job as
  live and pushes after it ended (a submit whose job is cancelled between its commit
  and its push) is a no-op, in the same script, so such a job never stands ready.
* Every multi-key step is one Lua script, so it is atomic.
* Redis is an index, not the record: callers change the job record first (the
  guarded UPDATE), then mirror it here. A step that fails here is repaired by
  the reaper and the reconciler, never lost.
* Redis errors surface as :class:`~hypermedia.errors.QueueUnavailable`, and are
  counted: :meth:`RedisQueue.reconcile_wanted` says when Redis may have missed
  writes (or lost its data) since the last reconcile, so it runs at once.

Times are epoch seconds in the API and epoch milliseconds inside Redis.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar

import redis
from redis.backoff import ExponentialBackoff
from redis.commands.core import Script
from redis.retry import Retry

from hypermedia.errors import QueueUnavailable
from hypermedia.queue.keys import (
    ENDED_KEPT_SECONDS,
    WAKE_TOKENS_MAX,
    WORKER_WAKE_TTL_SECONDS,
    QueueKeys,
    queue_keys,
    reconciled_key,
    worker_wake_key,
)

P = ParamSpec("P")
T = TypeVar("T")

Target = Literal["ready", "leased", "delayed"]


def connect(url: str) -> redis.Redis:
    """A client that retries transient connection errors a few times, then fails."""
    return redis.Redis.from_url(
        url,
        decode_responses=True,
        socket_timeout=10,
        socket_connect_timeout=5,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=3),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise QueueUnavailable(f"redis unreachable: {exc}") from exc


def _redis_call(
    func: Callable[Concatenate[RedisQueue, P], T],
) -> Callable[Concatenate[RedisQueue, P], T]:
    """A queue method whose Redis errors become QueueUnavailable, each one counted
    (see :meth:`RedisQueue.reconcile_wanted`)."""

    @functools.wraps(func)
    def wrapper(self: RedisQueue, /, *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            with _translated():
                return func(self, *args, **kwargs)
        except QueueUnavailable:
            self._lost_contact()
            raise

    return wrapper


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


@dataclass(frozen=True, slots=True)
class Leased:
    job_id: str
    priority: int


@dataclass(frozen=True, slots=True)
class Restore:
    """One entry the reconciler puts back: where, with what score."""

    target: Target
    job_id: str
    priority: int
    at: float = 0.0  # deadline (leased) or due time (delayed), epoch seconds
    worker_id: str = ""


PRIORITIES = range(1, 11)  # 1 most urgent .. 10


@dataclass(frozen=True, slots=True)
class QueueCounts:
    ready: int
    leased: int
    delayed: int


class RedisQueue:
    """All queues of one deployment (one key prefix) on one Redis."""

    def __init__(self, client: redis.Redis, prefix: str, queues: Iterable[str]) -> None:
        self.client = client
        self.prefix = prefix
        self.queues = tuple(queues)
        self._keys = {q: queue_keys(prefix, q) for q in self.queues}
        self._scripts = {name: self._load(name) for name in _SCRIPT_NAMES}
        self._reconciled = reconciled_key(prefix)
        self._contact = threading.Lock()
        self._failures = 0  # calls that could not reach Redis, ever
        self._failures_reconciled = 0  # ... as counted when the last good reconcile began

    # -- is Redis missing what the record holds? -----------------------------------

    def _lost_contact(self) -> None:
        with self._contact:
            self._failures += 1

    def reconcile_wanted(self) -> bool:
        """True when Redis may lack jobs the record holds, so the reconciler should run
        now rather than at its next interval: a call of this queue could not reach Redis
        since the last reconcile began (a submit's enqueue was deferred, a restart may
        have lost writes), or the marker the reconciler leaves is gone (FLUSHALL, a
        restart without persistence). False while Redis is unreachable: it is asked
        again on the next tick, and answers True once Redis is back."""
        with self._contact:
            pending = self._failures != self._failures_reconciled
        try:
            if pending:
                return bool(self.client.ping())
            return not self.client.exists(self._reconciled)
        except (redis.ConnectionError, redis.TimeoutError):
            self._lost_contact()
            return False

    def reconcile_begins(self) -> int:
        """A reconcile starts: a token for :meth:`reconciled`."""
        with self._contact:
            return self._failures

    @_redis_call
    def reconciled(self, token: int) -> None:
        """The reconcile that began with ``token`` went through: leave the marker, and
        forget the failures counted before it began."""
        self.client.set(self._reconciled, f"{time.time():.3f}")
        with self._contact:
            self._failures_reconciled = max(self._failures_reconciled, token)

    def _load(self, name: str) -> Script:
        source = resources.files("hypermedia.queue").joinpath(f"scripts/{name}.lua").read_text()
        return self.client.register_script(source)

    def keys(self, queue: str) -> QueueKeys:
        try:
            return self._keys[queue]
        except KeyError:
            raise ValueError(f"unknown queue {queue!r}; configured: {self.queues}") from None

    def _run(self, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        return self._scripts[script](keys=list(keys), args=list(args))

    # -- producers -------------------------------------------------------------

    @_redis_call
    def enqueue(self, queue: str, entries: Sequence[tuple[str, int]]) -> int:
        """Make jobs ready: ``entries`` are (job_id, priority). Those removed as ended
        within :data:`ENDED_KEPT_SECONDS` stay out. Returns how many were made ready."""
        if not entries:
            return 0
        k = self.keys(queue)
        args: list[Any] = [WAKE_TOKENS_MAX]
        for job_id, priority in entries:
            args += [priority, job_id]
        return int(
            self._run(
                "enqueue", (k.ready, k.leased, k.owner, k.delayed, k.prio, k.wake, k.ended), args
            )
        )

    # -- consumers -------------------------------------------------------------

    @_redis_call
    def claim(
        self, queue: str, worker_id: str, lease_seconds: float, now: float, count: int = 1
    ) -> list[Leased]:
        """Lease up to ``count`` jobs, best first. Empty when the queue is empty."""
        k = self.keys(queue)
        flat = self._run(
            "claim", (k.ready, k.leased, k.owner), (_ms(now + lease_seconds), worker_id, count)
        )
        return [Leased(flat[i], int(float(flat[i + 1]))) for i in range(0, len(flat), 2)]

    @_redis_call
    def unlease(self, queue: str, worker_id: str, leased: Sequence[Leased]) -> int:
        """Put leases ``worker_id`` still holds back in ``ready`` at their priority (a
        claim the record could not take). Returns how many went back."""
        if not leased:
            return 0
        k = self.keys(queue)
        args: list[Any] = [WAKE_TOKENS_MAX, worker_id]
        for entry in leased:
            args += [entry.priority, entry.job_id]
        return int(self._run("unlease", (k.ready, k.leased, k.owner, k.prio, k.wake), args))

    @_redis_call
    def wait(self, queue: str, timeout: float, worker_id: str | None = None) -> bool:
        """Block until a wake-up token arrives or ``timeout`` passes. True if woken.
        ``worker_id``: that worker's own tokens (:meth:`wake_worker`) wake it too."""
        keys = [self.keys(queue).wake]
        if worker_id is not None:
            keys.append(worker_wake_key(self.prefix, queue, worker_id))
        return self.client.blpop(keys, timeout=max(timeout, 0.01)) is not None

    @_redis_call
    def wake_worker(self, queue: str, worker_id: str, loops: int) -> None:
        """Wake ``loops`` of a worker's claim loops blocked in :meth:`wait` (one token
        each), at once: it stopped claiming, and BLPOP cannot be interrupted."""
        key = worker_wake_key(self.prefix, queue, worker_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.rpush(key, *["1"] * max(loops, 1))
        pipe.expire(key, WORKER_WAKE_TTL_SECONDS)
        pipe.execute()

    @_redis_call
    def extend(self, queue: str, job_id: str, worker_id: str, deadline: float) -> bool:
        k = self.keys(queue)
        return bool(self._run("extend", (k.leased, k.owner), (job_id, worker_id, _ms(deadline))))

    @_redis_call
    def delay(self, queue: str, entries: Sequence[tuple[str, float]]) -> None:
        """Park jobs until due: ``entries`` are (job_id, due epoch seconds). Those
        removed as ended within :data:`ENDED_KEPT_SECONDS` are parked nowhere."""
        if not entries:
            return
        k = self.keys(queue)
        args: list[Any] = []
        for job_id, due in entries:
            args += [_ms(due), job_id]
        self._run("delay", (k.ready, k.leased, k.owner, k.delayed, k.prio, k.ended), args)

    @_redis_call
    def remove(self, queue: str, job_ids: Sequence[str], *, tombstone: bool = True) -> int:
        """Forget jobs: terminal in the record (cancelled, failed), or unknown to it, so
        each gets a tombstone that keeps any later push from putting it back for
        :data:`ENDED_KEPT_SECONDS`. ``tombstone=False``: none, for a live job only
        cleared from its set, to be put in another (:meth:`restore`), and for a
        completion (the push that raced it was its own, long done: a tombstone per
        completion would hold ~130 bytes x completions a second x 300 s of Redis's
        memory, 180 MB at the no-op drain's 4,700 a second). Returns how many left a
        set."""
        if not job_ids:
            return 0
        k = self.keys(queue)
        keep = _ms(ENDED_KEPT_SECONDS) if tombstone else 0
        return int(
            self._run(
                "remove",
                (k.ready, k.leased, k.owner, k.delayed, k.prio, k.ended),
                [_ms(time.time()), keep, *job_ids],
            )
        )

    @_redis_call
    def restore(self, queue: str, entries: Sequence[Restore]) -> int:
        """Add entries only where the job is in no set now and was not removed as ended
        within :data:`ENDED_KEPT_SECONDS`. Returns how many were added."""
        if not entries:
            return 0
        k = self.keys(queue)
        args: list[Any] = [WAKE_TOKENS_MAX]
        for e in entries:
            score = e.priority if e.target == "ready" else _ms(e.at)
            args += [e.target, score, e.job_id, e.priority, e.worker_id]
        return int(self._run("restore", k.all(), args))

    # -- inspection ------------------------------------------------------------

    @_redis_call
    def expired_leases(self, queue: str, now: float, limit: int = 1000) -> list[str]:
        ids = self.client.zrangebyscore(self.keys(queue).leased, "-inf", _ms(now), 0, limit)
        return [str(i) for i in ids]

    @_redis_call
    def due_retries(self, queue: str, now: float, limit: int = 1000) -> list[str]:
        ids = self.client.zrangebyscore(self.keys(queue).delayed, "-inf", _ms(now), 0, limit)
        return [str(i) for i in ids]

    @_redis_call
    def counts(self, queue: str) -> QueueCounts:
        k = self.keys(queue)
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(k.ready)
        pipe.zcard(k.leased)
        pipe.zcard(k.delayed)
        ready, leased, delayed = pipe.execute()
        return QueueCounts(int(ready), int(leased), int(delayed))

    @_redis_call
    def priority_heads(self, queue: str) -> dict[int, tuple[int, str]]:
        """For each priority with ready jobs: ``(how many, the oldest one's id)``.

        Within one priority the ready set is in id order, which is age order (see
        :mod:`hypermedia.ids`), so the first member is the oldest. One round trip."""
        ready = self.keys(queue).ready
        pipe = self.client.pipeline(transaction=False)
        for priority in PRIORITIES:
            pipe.zcount(ready, priority, priority)
            pipe.zrangebyscore(ready, priority, priority, start=0, num=1)
        answers = pipe.execute()
        heads = {}
        for index, priority in enumerate(PRIORITIES):
            count, first = answers[2 * index], answers[2 * index + 1]
            if count:
                heads[priority] = (int(count), str(first[0]))
        return heads

    @_redis_call
    def members(self, queue: str) -> dict[str, Target]:
        """Every job id Redis holds for ``queue`` and the set it is in."""
        k = self.keys(queue)
        found: dict[str, Target] = {}
        for target, key in (("ready", k.ready), ("leased", k.leased), ("delayed", k.delayed)):
            for job_id in self.client.zscan_iter(key, count=1000):
                found[job_id[0]] = target  # type: ignore[assignment]
        return found

    @_redis_call
    def ready_ids(self, queue: str) -> list[str]:
        """Ready jobs in claim order (for operators and tests)."""
        return [str(i) for i in self.client.zrange(self.keys(queue).ready, 0, -1)]

    @_redis_call
    def ping(self) -> bool:
        return bool(self.client.ping())


_SCRIPT_NAMES = ("enqueue", "claim", "unlease", "extend", "delay", "remove", "restore")
