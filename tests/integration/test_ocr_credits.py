"""Credits of a real ocr job that escalates: the page whose lines 2
and 4 are upside down (tests/generated/ocr_pages.py) makes the chain's first engine
read it weakly, so the page goes on to the next engine: each such escalation costs the
ocr profile's ``unit_costs.escalation`` on top of the estimate.

The submit reserves the estimate plus the most the step may escalate (an image is one
page; the shipped chain of 3 engines escalates it twice at most), so an account that
holds only the estimate is refused (402, nothing created) rather than charged past its
balance; an account that holds exactly the worst case runs the job through a worker
(the real sandbox and its fork server, minus Ray), is charged the estimate plus the
escalations that happened, keeps the rest and holds nothing afterwards.

On PostgreSQL only: the same charge, release and 402 on SQLite are test_ingest's
(test_an_ocr_job_needs_its_escalations_reserved, test_a_completion_charges_at_most_the_
reservation run on both); what this adds is the real engines' escalations, ~10 CPU-s.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from hypermedia import accounts
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.embedded import listening_socket
from hypermedia.errors import PaymentRequired
from hypermedia.ingest.client import HypermediaClient
from hypermedia.sandbox.executor import ChildExecutor
from hypermedia.stack import Stack
from hypermedia.storage.grants import StorageGrants
from hypermedia.worker.actor import queue_preload
from hypermedia.worker.execute import JobExecution
from hypermedia.worker.worker import Worker
from tests import ray_support
from tests.factories import Person, make_user
from tests.generated import Generated
from tests.pipelines_for_tests import PRELOAD

REPO = Path(__file__).resolve().parents[2]
PAGE = "ocr/mixed-orientation.png"


@contextmanager
def ocr_worker(stack: Stack, work_root: Path) -> Iterator[Worker]:
    """A worker of the ocr queue as a pipeline actor runs it, minus Ray."""
    grants = StorageGrants(stack.engine, stack.storage, 900, stack.clock)
    preload = queue_preload(stack.catalog, "ocr", PRELOAD)
    with ChildExecutor(work_root, preload=preload, job_cpus=1) as executor:
        execution = JobExecution(stack.dispatcher, stack.catalog, grants, executor, "ocr-w")
        worker = Worker(
            worker_id="ocr-w",
            queue="ocr",
            concurrency=1,
            engine=stack.engine,
            dispatcher=stack.dispatcher,
            execution=execution,
            work_root=str(work_root),
            clock=stack.clock,
        )
        worker.start()
        try:
            yield worker
        finally:
            worker.stop()


def _balance(stack: Stack, person: Person) -> accounts.Balance:
    with transaction(stack.engine) as conn:
        return accounts.balance(conn, person.caller.user_id)


# A quiet machine: ~15 s; beside other work on 2 cores, several times that.
@pytest.mark.timeout(600)
def test_an_escalating_ocr_job_is_charged_within_its_reservation(
    pg_engine: Engine, settings, tmp_path: Path, generated: Generated
):
    engine = pg_engine
    sock = listening_socket()
    chosen = settings(
        api_url=f"http://127.0.0.1:{sock.getsockname()[1]}",
        profiles_path=ray_support.test_profiles(tmp_path),
    )
    stack = Stack.open(chosen, engine=engine, auto_migrate=True)
    price = round(
        tomllib.loads((REPO / "etc/profiles.toml").read_text())["profiles"]["ocr"]["unit_costs"][
            "escalation"
        ]
        * 1000
    )
    profile = stack.catalog.get("ocr")
    page = generated / PAGE
    estimate = profile.estimate_millicredits(page.stat().st_size)
    engines = len(profile.params["engines"])
    worst = estimate + price * (engines - 1)  # one page, every engine of the chain
    try:
        with ray_support.api_server(stack, sock) as base_url:
            short = make_user(stack, credits=estimate / 1000)
            enough = make_user(stack, credits=worst / 1000)
            with HypermediaClient(base_url, short.api_key, timeout=60) as client:
                obj = client.upload(page)
                with pytest.raises(PaymentRequired) as caught:
                    client.process(obj.object_id, ["ocr"])
            assert caught.value.details["required_credits"] == worst / 1000
            assert caught.value.details["available_credits"] == estimate / 1000
            assert f"this needs {worst / 1000:g} reserved" in caught.value.message
            with transaction(stack.engine) as conn:
                mine = select(t.jobs.c.job_id).where(t.jobs.c.user_id == short.caller.user_id)
                assert conn.execute(mine).all() == []
            assert _balance(stack, short) == accounts.Balance(estimate, 0)

            with HypermediaClient(base_url, enough.api_key, timeout=60) as client:
                obj = client.upload(page)
                submitted = client.process(obj.object_id, ["ocr"])
                (job,) = submitted.jobs
                assert (job.estimated_credits, job.reserved_credits) == (
                    estimate / 1000,
                    worst / 1000,
                )
                assert submitted.reserved_credits == worst / 1000
                assert _balance(stack, enough) == accounts.Balance(worst, worst)
                with ocr_worker(stack, tmp_path / "work"):
                    view = client.wait(job.job_id, timeout=480)
            balance = _balance(stack, enough)
    finally:
        stack.close()
    assert view.status == "completed", (view.error_code, view.error_message)
    (attempt,) = view.attempts
    assert attempt.units is not None
    escalations = attempt.units["escalation"]
    assert 1 <= escalations <= engines - 1, attempt.units
    actual = estimate + price * escalations
    assert view.actual_credits is not None and round(view.actual_credits * 1000) == actual
    assert view.reserved_credits == worst / 1000
    # Charged what happened; the rest of the reservation is back; nothing held.
    assert balance == accounts.Balance(worst - actual, 0)
    assert balance.balance_millicredits >= 0
