"""A pipeline actor's body (:class:`~hypermedia.worker.actor.PipelineService`) built
without Ray, as the actor's process builds it, with the real sandboxed executor."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError

from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.stack import Stack
from hypermedia.worker.actor import PipelineService
from hypermedia.worker.supervisor import settings_for_actors
from tests.pipelines_for_tests import PRELOAD
from tests.sandbox_leaks import leaked_sandbox_processes
from tests.worker_support import NoGrants

pytestmark = pytest.mark.root("the full sandbox needs root")


def _register(engine, worker_id: str) -> None:
    """A workers row of that id already in the record (the registration then fails)."""
    now = datetime.now(UTC)
    with transaction(engine) as conn:
        conn.execute(
            insert(t.workers).values(
                worker_id=worker_id,
                queue="images",
                hostname="elsewhere",
                pid=1,
                status="active",
                concurrency=1,
                started_at=now,
                last_heartbeat=now,
            )
        )


@pytest.mark.parametrize(
    ("failing", "error"),
    [("an unknown queue", KeyError), ("a worker id already registered", IntegrityError)],
)
def test_a_service_that_fails_to_start_leaves_no_fork_server(
    failing, error, sqlite_engine, settings, tmp_path
):
    """Its fork server (and spares) made, then the Worker's argument (no such queue)
    or its registration (that worker id is taken) failed: __init__ raises, and what it
    made is closed. Before, they lived on for as long as anything held the failed
    constructor's traceback (pytest's ``excinfo`` here), or until a garbage collection
    closed the executor's control socket, if one ever did."""
    head = settings()
    Stack.open(head, engine=sqlite_engine, auto_migrate=True).close()  # profiles in the record
    assert head.redis_url is not None
    actor_settings = {**settings_for_actors(head, head.redis_url), "data_dir": str(tmp_path)}
    queue = "no-such-queue" if failing == "an unknown queue" else "images"
    if failing == "a worker id already registered":
        _register(sqlite_engine, "w1")
    with pytest.raises(error) as excinfo:
        PipelineService(actor_settings, queue, "w1", 1, NoGrants(), preload=PRELOAD)
    # It failed after making its executor (whose fork server had answered ready).
    [service] = [
        entry.frame.f_locals["self"]
        for entry in excinfo.traceback
        if isinstance(entry.frame.f_locals.get("self"), PipelineService)
    ]
    assert hasattr(service, "executor")
    # Gone (its spares and PID namespace inits die with it, of their PDEATHSIG).
    assert leaked_sandbox_processes(tmp_path, grace=10) == []
