"""Keeps the pipeline actor pools alive and notices deaths at once.

For each queue it runs the configured number of actors, each holding
``serve()`` open. When an actor or its node dies, Ray fails that call with
``RayActorError``; the supervisor then sends the dead worker's in-flight jobs
straight back to their queues (``Dispatcher.recover_worker``), marks it dead in
``workers``, removes the workdirs it left on this node (:mod:`hypermedia.workdirs`)
and starts a replacement if its pool is short of what it wants (a pool a burst node's
drain shrank is not: a replacement there would wait, pending, for a node nobody
launches). The lease reaper stays the safety net for deaths nobody reports (the
whole head gone).

Stopping drains the actors that exist; one never placed on a node (pending: no node
with room for it) has no job to finish and is not waited for.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError
from sqlalchemy import select, update

from hypermedia import workdirs
from hypermedia.clock import to_datetime
from hypermedia.config import Settings, is_secret_setting
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.errors import HypermediaError, ServiceUnavailable, from_traceback
from hypermedia.ids import new_id
from hypermedia.stack import Stack
from hypermedia.storage import credentials
from hypermedia.worker.actor import HEAD_RESOURCE, GrantsActor, PipelineActor

log = logging.getLogger(__name__)

NAMESPACE = "hypermedia"
# Heartbeats a worker may miss before one that is none of ours counts as dead.
STALE_HEARTBEATS = 4
# How often a death whose jobs the record could not take back (the database down when
# Ray told of it) is tried again, until it answers.
RECOVER_RETRY_SECONDS = 1.0


@dataclass
class Member:
    worker_id: str
    queue: str
    actor: Any
    serving: Any  # ObjectRef of actor.serve()
    created: Any  # ObjectRef of actor.pid(): answered once the actor exists


@dataclass
class SupervisorEvents:
    started: list[str] = field(default_factory=list)
    died: list[str] = field(default_factory=list)
    recovered_jobs: list[str] = field(default_factory=list)


# Facts of the node an actor runs on, not of the head: a spot burst node's boot script
# sets HYPERMEDIA_SPOT_WATCH, and the actor there reads it from its own environment.
NODE_SETTINGS = ("spot_watch", "metadata_url", "spot_poll_seconds")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours the task's name in its traceback


def start_error(what: str, exc: RayActorError) -> Exception:
    """Why an actor's constructor failed, for the operator: the error it raised, as
    itself when it is one of ours (a ConfigError names its key: ``up`` said only
    ``internal: UnserializableException``, or Ray's whole traceback), else the
    traceback's last line."""
    text = _ANSI.sub("", str(exc))
    error = from_traceback(text)
    if error is not None:
        return error
    last = (text.strip().splitlines() or [type(exc).__name__])[-1]
    return ServiceUnavailable(f"{what} could not start: {last}")


def settings_for_actors(settings: Settings, redis_url: str) -> dict[str, Any]:
    """Plain settings an actor rebuilds its own connections from.

    No secret setting (:func:`~hypermedia.config.is_secret_setting`): pipeline actors
    move bytes with per-job URLs, the grants actor gets the head's credentials through a
    file (:mod:`hypermedia.storage.credentials`), the head alone signs callbacks, and a
    client's API key is nobody's business here (a masked secret would not even load:
    ten asterisks are too short for a signing secret). The database and Redis URLs,
    passwords included, go as they are: every actor connects to both. They travel as
    constructor arguments (Ray's control plane, token-authenticated, held in memory),
    never in ``runtime_env`` (which Ray logs) nor on a command line, and no file of
    Ray's holds them (tests/e2e/test_secrets.py scans for them)."""
    secret = {name for name in Settings.model_fields if is_secret_setting(name)}
    exclude = {*NODE_SETTINGS, *secret}
    data = settings.model_dump(mode="json", exclude_none=True, exclude=exclude)
    data["redis_url"] = redis_url
    data["database_url"] = settings.effective_database_url
    return data


class Supervisor:
    # The Ray actor class each pool member is (a benchmark's subclass swaps its own in).
    actor_class: Any = PipelineActor

    def __init__(
        self,
        stack: Stack,
        actor_settings: dict[str, Any],
        pools: Mapping[str, int],
        *,
        preload: tuple[str, ...] = ("pipelines.registry",),
        heartbeat_seconds: float = 30.0,
        metrics_seconds: float = 60.0,
        worker_options: Mapping[str, Any] | None = None,
    ) -> None:
        """``worker_options``: passed to every pipeline actor (see
        :class:`~hypermedia.worker.actor.PipelineService`); none in production."""
        self.stack = stack
        self.actor_settings = actor_settings
        self.pools = dict(pools)
        self.preload = preload
        self.heartbeat_seconds = heartbeat_seconds
        self.metrics_seconds = metrics_seconds
        self.worker_options = dict(worker_options or {})
        self.members: dict[Any, Member] = {}
        self.events = SupervisorEvents()
        self.grants: Any = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        # Held while a pool's count is checked and the actors it lacks are started (a
        # death's replacement, resize): two of them at once would fill one gap twice.
        self._sizing = threading.Lock()
        self._thread: threading.Thread | None = None
        # Deaths whose recovery the record refused (worker id -> reason), tried again
        # by the watcher: the database back, their jobs go back then, not when the
        # stale-heartbeat sweep or the lease's expiry finds them (minutes later).
        self._unrecovered: dict[str, str] = {}
        self._unrecovered_lock = threading.Lock()

    # -- lifecycle --------------------------------------------------------------

    def start(self) -> None:
        self._start_grants()
        for queue, count in self.pools.items():
            for _ in range(count):
                self._spawn(queue)
        self._thread = threading.Thread(target=self._watch, name="supervisor", daemon=True)
        self._thread.start()

    def _start_grants(self) -> None:
        """The grants actor, on the head's node: the head's storage credentials reach
        it through a private file that is gone once it answers (never through Ray:
        see :mod:`hypermedia.storage.credentials`); pipeline actors never see them."""
        settings = self.stack.settings
        handed = credentials.of_head(settings, os.environ)
        path = credentials.write(settings.data_dir, handed) if handed else None
        try:
            self.grants = GrantsActor.options(
                num_cpus=0,
                max_concurrency=16,
                resources={HEAD_RESOURCE: 0.001},
                namespace=NAMESPACE,
            ).remote(self.actor_settings, str(path) if path is not None else None)
            try:
                ray.get(self.grants.ping.remote())
            except RayActorError as exc:
                if exc.actor_init_failed:
                    raise start_error("the grants actor", exc) from None
                raise
        finally:
            if path is not None:
                credentials.remove(path)

    def _spawn(self, queue: str) -> Member:
        worker_id = f"{queue}-{new_id()[-12:]}"
        queue_settings = self.stack.settings.queues[queue]
        actor: Any = self.actor_class.options(
            # What Ray shows it using, and counts when placing it (see QueueSettings).
            num_cpus=queue_settings.cpus,
            max_concurrency=8,
            resources={f"queue_{queue}": 1},
            name=worker_id,
            namespace=NAMESPACE,
        ).remote(
            self.actor_settings,
            queue,
            worker_id,
            queue_settings.concurrency,
            self.grants,
            self.preload,
            self.heartbeat_seconds,
            self.metrics_seconds,
            self.worker_options,
        )
        member = Member(worker_id, queue, actor, actor.serve.remote(), actor.pid.remote())
        with self._lock:
            self.members[member.serving] = member
        self.events.started.append(worker_id)
        log.info("started %s on queue %s", worker_id, queue, extra={"worker_id": worker_id})
        return member

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Block until every actor has been created (its constructor ran and its
        ``created`` call answered, so :meth:`drain` counts it placed). One that dies
        first does not count: the watcher starts another, which is waited for in its
        place. TimeoutError names the workers not ready in time."""
        deadline = time.monotonic() + timeout
        ready: set[str] = set()
        dead: set[str] = set()
        asked: dict[Any, str] = {}
        while True:
            with self._lock:
                members = [m for m in self.members.values() if m.worker_id not in dead]
            waiting = [m for m in members if m.worker_id not in ready]
            # A dead one's replacement may not be started yet: each pool's count, too.
            short = [
                queue
                for queue, wanted in self.pools.items()
                if sum(m.queue == queue and m.worker_id in ready for m in members) < wanted
            ]
            if not waiting and not short:
                return
            for member in waiting:
                asked.setdefault(member.created, member.worker_id)
            left = deadline - time.monotonic()
            if left <= 0:
                names = ", ".join(sorted(m.worker_id for m in waiting) + short)
                raise TimeoutError(f"pipeline actors not ready after {timeout:g} s: {names}")
            if not asked:
                time.sleep(min(left, 0.2))  # a replacement is being started
                continue
            answered, _ = ray.wait(list(asked), num_returns=1, timeout=min(left, 1.0))
            for ref in answered:
                worker_id = asked.pop(ref)
                try:
                    ray.get(ref)
                except RayActorError as exc:
                    if exc.actor_init_failed:  # its constructor raised: another would too
                        raise start_error(f"pipeline actor {worker_id}", exc) from None
                    dead.add(worker_id)  # the watcher logs it and starts another
                    continue
                ready.add(worker_id)

    # -- watching ------------------------------------------------------------------

    def _watch(self) -> None:
        next_check = next_retry = time.monotonic()
        while not self._stopping.is_set():
            if time.monotonic() >= next_retry:
                self._retry_recoveries()
                next_retry = time.monotonic() + RECOVER_RETRY_SECONDS
            if time.monotonic() >= next_check:
                self._mark_stale_workers()
                next_check = time.monotonic() + self.heartbeat_seconds
            with self._lock:
                refs = list(self.members)
            if not refs:
                self._stopping.wait(0.5)
                continue
            try:
                ready, _ = ray.wait(refs, num_returns=1, timeout=0.5)
            except (SystemExit, Exception):
                # Ray shut down under us (the driver is exiting): nothing to watch.
                if self._stopping.is_set() or not ray.is_initialized():
                    return
                log.exception("supervisor: waiting on the actors failed")
                self._stopping.wait(1.0)
                continue
            for ref in ready:
                self._ended(ref)

    def _ended(self, ref: Any) -> None:
        with self._lock:
            member = self.members.pop(ref, None)
        if member is None:
            return
        try:
            ray.get(ref)
        except RayActorError as exc:
            self._died(member, death_reason(exc))
            return
        except Exception:
            log.exception("worker %s ended with an error", member.worker_id)
            self._died(member, "serve() raised")
            return
        log.info("worker %s stopped", member.worker_id, extra={"worker_id": member.worker_id})

    def _died(self, member: Member, reason: str) -> None:
        log.warning(
            "worker %s died: %s",
            member.worker_id,
            reason,
            extra={"worker_id": member.worker_id, "queue": member.queue, "action": "died"},
        )
        self._recover(member, reason)
        # Its jobs' files (copies of user input) on this node: nobody else removes them.
        workdirs.remove_worker(self.stack.settings.data_dir, member.worker_id)
        # Replaced while its pool wants more than are left: not when the scheduler
        # drained its node (the pool shrank with it) nor after the pool was resized down.
        with self._sizing:
            if not self._stopping.is_set() and len(self.actors(member.queue)) < self.pools.get(
                member.queue, 0
            ):
                self._spawn(member.queue)
        # Recorded once handled: whoever sees the death sees its jobs recovered (and
        # any replacement started) too.
        self.events.died.append(member.worker_id)

    def _recover(self, member: Member, reason: str) -> None:
        """A member gone without finishing: its in-flight jobs go back to their queues
        now, and it is marked dead. When the record cannot be written (the database
        down), the watcher tries again every :data:`RECOVER_RETRY_SECONDS` until it
        can."""
        if not self._recover_worker(member.worker_id, reason):
            with self._unrecovered_lock:
                self._unrecovered[member.worker_id] = reason

    def _recover_worker(self, worker_id: str, reason: str) -> bool:
        try:
            recovered = self.stack.dispatcher.recover_worker(worker_id, reason[:500])
            self.events.recovered_jobs.extend(recovered)
            with transaction(self.stack.engine) as conn:
                conn.execute(
                    update(t.workers)
                    .where(t.workers.c.worker_id == worker_id)
                    .values(status="dead", stopped_at=to_datetime(self.stack.clock.now()))
                )
        except HypermediaError as exc:
            log.warning(
                "recovering %s: %s (tried again every %g s)",
                worker_id,
                exc,
                RECOVER_RETRY_SECONDS,
                extra={"worker_id": worker_id, "action": "recover"},
            )
            return False
        return True

    def _retry_recoveries(self) -> None:
        with self._unrecovered_lock:
            waiting = dict(self._unrecovered)
        for worker_id, reason in waiting.items():
            if not self._recover_worker(worker_id, reason):
                return  # the database is still down: the rest wait for the next try
            with self._unrecovered_lock:
                self._unrecovered.pop(worker_id, None)
            log.info(
                "recovered %s once the database answered",
                worker_id,
                extra={"worker_id": worker_id, "action": "recover"},
            )

    def _mark_stale_workers(self) -> None:
        """Workers recorded active whose heartbeat is :data:`STALE_HEARTBEATS` beats old
        and that are none of ours (a head killed with -9 left them; nobody saw them
        die): their jobs go back now, and they are marked dead. Ours are alive as long
        as Ray says so, whatever their heartbeat (the database may have been down)."""
        now = self.stack.clock.now()
        cutoff = to_datetime(now - STALE_HEARTBEATS * self.heartbeat_seconds)
        w = t.workers.c
        stale = (w.status.in_(("active", "draining"))) & (w.last_heartbeat < cutoff)
        try:
            with transaction(self.stack.engine) as conn:
                found = set(conn.execute(select(w.worker_id).where(stale)).scalars())
            ours = {m.worker_id for m in self.actors()}
            for worker_id in sorted(found - ours):
                self.stack.dispatcher.recover_worker(worker_id, "heartbeat stale")
                with transaction(self.stack.engine) as conn:
                    conn.execute(
                        update(t.workers)
                        .where(stale & (w.worker_id == worker_id))
                        .values(status="dead", stopped_at=to_datetime(now))
                    )
                log.warning(
                    "worker %s: no heartbeat since before %s, marked dead",
                    worker_id,
                    cutoff.isoformat(),
                    extra={"worker_id": worker_id, "action": "stale"},
                )
        except HypermediaError as exc:
            log.warning("checking for stale workers: %s", exc)

    # -- elastic pools (burst nodes) ---------------------------------------------------

    def resize(self, pools: Mapping[str, int]) -> list[str]:
        """Run at least ``pools[queue]`` actors per queue: the missing ones are started at
        once, and wait (pending) until a node with room for them joins. Fewer actors only
        come from :meth:`retire_node`: which actors leave is the scheduler's choice.
        Answers the worker ids started."""
        started = []
        with self._sizing:
            for queue, wanted in pools.items():
                self.pools[queue] = wanted
                live = len(self.actors(queue))
                for _ in range(max(0, wanted - live)):
                    started.append(self._spawn(queue).worker_id)
        return started

    def retire_node(self, node_id: str, timeout: float) -> list[str]:
        """The actors on one Ray node (hex id) stop claiming, finish (or after ``timeout``
        hand back) their jobs and exit, and are not replaced: the node is being drained.
        Answers their worker ids."""
        with transaction(self.stack.engine) as conn:
            on_node = set(
                conn.execute(
                    select(t.workers.c.worker_id).where(
                        (t.workers.c.node_id == node_id)
                        & t.workers.c.status.in_(("active", "draining"))
                    )
                ).scalars()
            )
        with self._sizing:  # a death meanwhile sees the pool already smaller
            with self._lock:
                leaving = [m for m in self.members.values() if m.worker_id in on_node]
                for member in leaving:
                    self.members.pop(member.serving, None)
            for member in leaving:
                self.pools[member.queue] = max(0, self.pools.get(member.queue, 0) - 1)
        for member in leaving:
            threading.Thread(
                target=self._retire, args=(member, timeout), name="retire", daemon=True
            ).start()
        return [m.worker_id for m in leaving]

    def _retire(self, member: Member, timeout: float) -> None:
        try:
            released = ray.get(member.actor.drain.remote(timeout), timeout=timeout + 60)
            if released:
                log.info("worker %s handed back %d jobs", member.worker_id, len(released))
        except Exception as exc:  # the node may already be gone: its jobs are recovered
            log.warning("retiring %s: %s", member.worker_id, exc)
            self._recover(member, f"retired: {exc}")
        finally:
            ray.kill(member.actor)  # its node can only go idle once the actor is gone
        log.info("worker %s retired", member.worker_id, extra={"worker_id": member.worker_id})

    # -- operations ------------------------------------------------------------------

    def actors(self, queue: str | None = None) -> list[Member]:
        with self._lock:
            return [m for m in self.members.values() if queue is None or m.queue == queue]

    def stats(self) -> dict[str, dict[str, int]]:
        members = self.actors()
        results = ray.get([m.actor.stats.remote() for m in members], timeout=30)
        return {m.worker_id: r for m, r in zip(members, results, strict=True)}

    def drain(self, timeout: float) -> list[str]:
        """Every actor stops claiming, finishes (or after ``timeout`` hands back) its
        jobs and exits. Answers the ids of jobs handed back. An actor not yet placed on
        a node (pending) is not waited for, nor one that does not answer within
        ``timeout`` + 30 s: :meth:`stop` kills them, and their jobs, if any, go back."""
        self._stopping.set()
        members = self.actors()
        created = [m.created for m in members]
        answered, _ = ray.wait(created, num_returns=len(created), timeout=0)
        placed = [m for m in members if m.created in answered]
        deadline = time.monotonic() + timeout + 30
        asked = {m.actor.drain.remote(timeout): m for m in placed}
        done, _ = ray.wait(list(asked), num_returns=len(asked), timeout=timeout + 30)
        released: list[str] = []
        for ref in done:
            try:
                released.extend(ray.get(ref))
            except RayActorError as exc:  # died meanwhile: stop() recovers its jobs
                log.warning("draining %s: %s", asked[ref].worker_id, death_reason(exc))
        drained = [asked[ref] for ref in done]
        left = max(0.0, deadline - time.monotonic())
        ray.wait([m.serving for m in drained], num_returns=len(drained), timeout=left)
        return released

    def stop(self, drain_timeout: float = 30.0) -> None:
        if self._thread is None and not self.members:
            return
        try:
            self.drain(drain_timeout)
        finally:
            self._stopping.set()
            if self._thread is not None:
                self._thread.join(5)
                self._thread = None
            for member in self.actors():
                why = _not_drained(member)
                ray.kill(member.actor)
                if why:  # pending, dead, or not drained in time: its jobs go back
                    log.warning(
                        "stopping %s: %s; killed, its jobs go back",
                        member.worker_id,
                        why,
                        extra={"worker_id": member.worker_id, "queue": member.queue},
                    )
                    self._recover(member, f"stopped before it had drained: {why}")
            if self.grants is not None:
                ray.kill(self.grants)


def _not_drained(member: Member) -> str:
    """Why ``member`` has not drained ("" if its serve() returned), without waiting."""
    if not ray.wait([member.created], timeout=0)[0]:
        return "not started yet (waiting for a node, or still starting)"
    if not ray.wait([member.serving], timeout=0)[0]:
        return "did not drain in time"
    try:
        ray.get(member.serving)
    except RayActorError as exc:
        return death_reason(exc)
    except Exception as exc:
        return f"serve() raised {type(exc).__name__}: {exc}"
    return ""


def death_reason(exc: BaseException) -> str:
    """One line for an actor's death. When its creation task raised: Ray's first line
    (which actor, where) and the last line of that traceback (what was raised). A
    system death (process killed, node gone, never started): every line Ray gave but
    the actor's fields (class, id, pid, name, namespace, ip), which say nothing new."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return "actor died"
    if "creation task" in lines[0]:
        return f"{lines[0]} ... {lines[-1]}" if lines[-1] != lines[0] else lines[0]
    said = [line for line in lines if not line.startswith(_ACTOR_FIELDS)]
    return " ".join(said) if said else lines[0]


_ACTOR_FIELDS = ("class_name:", "actor_id:", "pid:", "name:", "namespace:", "ip:")
