"""The no-op job of each peer queue, as its own worker processes import it.

Every job takes the time it was enqueued (``time.time()``) and records that and the
time it started as one fixed-width line in a file of its worker process
(``<records>/<system>-<pid>.txt``): one ``write`` on an ``O_APPEND`` descriptor, no
network round trip, so recording costs every peer the same few microseconds.

The worker CLIs import this module by name; it reads the broker URL and the
records directory from the environment (``HYPERMEDIA_BENCH_PEER_REDIS_URL``,
``HYPERMEDIA_BENCH_PEER_RECORDS``), set by ``bench/peer_workers.py``:

* Celery: ``celery -A bench.peer_jobs:celery_app worker ...`` (task ``hm_bench.noop``)
* Dramatiq: ``dramatiq bench.peer_jobs:dramatiq_broker ...`` (actor ``noop``)
* RQ: ``rq worker ...`` runs :func:`rq_noop`, found by its import path.

The producer side builds the same app / actor with :func:`celery_app_for` and
:func:`dramatiq_actor_for`. Nothing is created at import time.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

REDIS_URL_ENV = "HYPERMEDIA_BENCH_PEER_REDIS_URL"
RECORDS_ENV = "HYPERMEDIA_BENCH_PEER_RECORDS"
QUEUE = "hm_bench"
LINE = "{:017.6f} {:017.6f}\n"  # enqueued, started: 36 bytes
LINE_BYTES = 36

_fd: int | None = None
_fd_pid = 0
_fd_lock = threading.Lock()


def record(enqueued: float, system: str) -> None:
    """Append (enqueued, started) to this process's record file."""
    started = time.time()
    global _fd, _fd_pid
    if _fd is None or _fd_pid != os.getpid():  # a forked pool child opens its own
        with _fd_lock:
            if _fd is None or _fd_pid != os.getpid():
                path = Path(os.environ[RECORDS_ENV]) / f"{system}-{os.getpid()}.txt"
                _fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                _fd_pid = os.getpid()
    os.write(_fd, LINE.format(enqueued, started).encode())


def rq_noop(enqueued: float) -> None:
    record(enqueued, "rq")


def _celery_noop(enqueued: float) -> None:
    record(enqueued, "celery")


def _dramatiq_noop(enqueued: float) -> None:
    record(enqueued, "dramatiq")


def celery_app_for(url: str) -> Any:
    import celery

    app = celery.Celery("hm_bench", broker=url, set_as_current=False)
    app.conf.update(
        task_ignore_result=True,
        task_default_queue=QUEUE,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    app.task(name="hm_bench.noop", ignore_result=True)(_celery_noop)
    return app


def dramatiq_actor_for(url: str) -> Any:
    """A Redis broker with the ``noop`` actor declared on it (no global broker set)."""
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=url)
    return dramatiq.actor(broker=broker, queue_name=QUEUE, actor_name="noop")(_dramatiq_noop)


def __getattr__(name: str) -> Any:
    """``celery_app`` and ``dramatiq_broker`` for the worker CLIs, built on first use."""
    if name == "celery_app":
        value = celery_app_for(os.environ[REDIS_URL_ENV])
    elif name == "dramatiq_broker":
        value = dramatiq_actor_for(os.environ[REDIS_URL_ENV]).broker
    else:
        raise AttributeError(name)
    globals()[name] = value
    return value
