"""A pooled connection that a failover left on a read-only server.

After a failover a connection made to the old primary once it was demoted (or through
a name not yet updated) is a standby's: it answers reads and pings, and refuses every
write, "cannot execute INSERT in a read-only transaction" (SQLSTATE 25006), for as long
as it lives. The pool kept it and handed it out again: every write on it failed, the
API answered 500 ``internal`` and a worker's completion batch was given up (its job,
done, left processing until its lease ran out). Now that answer drops the connection
(and the pool's others): the next checkout connects again, reaching the primary, and
the write meanwhile fails DatabaseUnavailable (the API's 503, the batcher's retry).

Staged on a private PostgreSQL: ``ALTER DATABASE ... SET default_transaction_read_only``
makes the connections made while it is set read-only for their whole life, as a
standby's are, and its RESET makes the next ones writable, as the new primary's are.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

from fastapi.testclient import TestClient
from sqlalchemy import Engine, select, text

from hypermedia.db import tables as t
from hypermedia.db.engine import make_engine, snapshot
from hypermedia.ingest.api import create_app
from hypermedia.ingest.service import SubmitRequest
from hypermedia.worker.execute import Completion, Outcome
from hypermedia.worker.worker import CompletionBatcher
from tests import ray_support
from tests.factories import make_object, make_user, open_stack
from tests.support import PrivatePostgres

P = "/v1/hypermedia"
TRIES = 5


def _set_read_only(server: PrivatePostgres, value: bool) -> None:
    admin = make_engine(server.server_url())
    try:
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            verb = "SET default_transaction_read_only = on" if value else "RESET ALL"
            conn.execute(text(f"ALTER DATABASE hypermedia {verb}"))
    finally:
        admin.dispose()


@contextmanager
def _pool_on_a_standby(server: PrivatePostgres, engine: Engine) -> Iterator[None]:
    """Every connection of ``engine``'s pool a read-only one (the old primary, demoted),
    every new one writable (the new primary)."""
    engine.dispose()
    _set_read_only(server, True)
    try:
        with snapshot(engine) as conn:  # the pool's connection, made read-only
            assert conn.execute(text("SHOW transaction_read_only")).scalar_one() == "on"
    finally:
        _set_read_only(server, False)
    yield


def test_a_write_refused_as_read_only_reconnects_and_goes_through(
    private_postgres: PrivatePostgres, settings, tmp_path, caplog
):
    engine = make_engine(private_postgres.url)
    profiles = str(ray_support.test_profiles(tmp_path))
    stack = open_stack(settings, engine, None, profiles_path=profiles)
    try:
        person = make_user(stack)
        obj = make_object(stack, person)
        stack.ingest.submit_many(
            person.caller, [SubmitRequest(object_id=obj, operations=["test.noop"])]
        )
        [job] = stack.dispatcher.claim_and_start("bulk", "ro-w")
        client = TestClient(create_app(stack, auth_cache_seconds=0), raise_server_exceptions=False)
        headers = {"Authorization": f"Bearer {person.api_key}"}
        body = {"object_id": obj, "operations": ["test.noop"]}

        with _pool_on_a_standby(private_postgres, engine):
            answers = []
            for _ in range(TRIES):
                answer = client.post(f"{P}/process", json=body, headers=headers)
                answers.append((answer.status_code, answer.json().get("error", {}).get("code")))
        # Old: [(500, 'internal')] * 5: the pooled connection refused every write.
        assert answers == [(503, "database_unavailable")] + [(202, None)] * (TRIES - 1), answers

        with _pool_on_a_standby(private_postgres, engine):
            outcomes: list[Outcome] = []
            batcher = CompletionBatcher(stack.dispatcher, "ro-w", outcomes.append)
            with caplog.at_level(logging.WARNING, logger="hypermedia.worker.worker"):
                batcher.add(Completion(job, [], None))
                deadline = time.monotonic() + 20
                while not outcomes:
                    assert time.monotonic() < deadline, caplog.text
                    time.sleep(0.05)
                batcher.close(30)
            assert "SQLSTATE 25006" in caplog.text  # it did meet the standby
        assert outcomes == [Outcome(job.job_id, "completed")]  # old: 'lost'
        with snapshot(engine) as conn:
            status = conn.execute(select(t.jobs.c.status).where(t.jobs.c.job_id == job.job_id))
            assert status.scalar_one() == "completed"
            assert conn.execute(text("SHOW transaction_read_only")).scalar_one() == "off"
    finally:
        stack.close()
        engine.dispose()
