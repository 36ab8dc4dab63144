"""Bulk runs on PostgreSQL and SQLite: keyset creation within the cap, idempotence, a
resume from an old cursor, a version bump regenerating exactly what is missing,
pause / resume / cancel, who pays, the dry run, and the operator-only API."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, text, update

from hypermedia import accounts
from hypermedia.bulk import runs
from hypermedia.bulk.runner import BulkRunner
from hypermedia.bulk.runs import PLATFORM_USER_ID, RunSpec
from hypermedia.bulk.service import BulkService
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.errors import Conflict, InvalidRequest, NotFound
from hypermedia.ingest import uploads
from hypermedia.ingest.service import SubmitRequest
from hypermedia.jobs.catalog import ProfileCatalog, sync_profiles
from hypermedia.jobs.dispatcher import Dispatcher
from hypermedia.jobs.repository import FinishedJob, OutputRecord
from hypermedia.objects import mark_deleted, plan_deletion
from hypermedia.profiles import load_profiles
from hypermedia.storage.base import derived_key
from tests import support
from tests.api_support import add_user, bearer
from tests.factories import image_inspection, make_object, make_user, open_stack


def _objects(stack, person, n: int) -> list[str]:
    return [make_object(stack, person) for _ in range(n)]


def _service(stack) -> BulkService:
    return BulkService(
        stack.engine, stack.queue, ProfileCatalog.load(stack.engine), clock=stack.clock
    )


def _runner(stack, **kw: Any) -> BulkRunner:
    return BulkRunner(stack.engine, stack.queue, clock=stack.clock, **kw)


def _paid_run(stack, person, credits: float, operation: str = "thumbnail", **spec: Any):
    """A backfill of ``person``'s pool paid for by the account ``payer`` (``credits``, a
    member of the pool: an account pays for a pool it is in): the service and the run."""
    payer = make_user(stack, name="payer", credits=credits)
    with transaction(stack.engine) as conn:
        accounts.add_pool_member(conn, person.pool_id, payer.caller.user_id)
    service = _service(stack)
    run = service.create(
        RunSpec(
            kind="backfill",
            operation=operation,
            account="payer",
            filter={"pool_id": person.pool_id},
            **spec,
        ),
        "t",
    )
    return payer, service, run


def _finish(stack, queue: str, pool_id: str, limit: int = 10_000) -> int:
    """Run what the queue holds as a worker would: each job completes with one output
    at its profile's version (a fake step: the record is what these tests are about)."""
    catalog = ProfileCatalog.load(stack.engine)
    dispatcher = Dispatcher(stack.engine, stack.queue, catalog, clock=stack.clock)
    done = 0
    while done < limit:
        claimed = dispatcher.claim_and_start(queue, "w-test", 50)
        if not claimed:
            return done
        finished = []
        for job in claimed:
            profile = catalog.by_id(job.profile_id)
            assert profile is not None
            version = profile.version
            output = f"{job.operation}-out"
            key = derived_key(pool_id, job.object_id, version, output)
            finished.append(FinishedJob(job.job_id, [OutputRecord(output, key, 10, "image/webp")]))
        dispatcher.complete_many("w-test", finished)
        done += len(claimed)
    return done


def _jobs_per_object(engine, run_id: str | None = None) -> Counter[str]:
    j = t.jobs.c
    stmt = select(j.object_id, func.count()).group_by(j.object_id)
    if run_id is not None:
        stmt = stmt.where(j.bulk_run_id == run_id)
    with transaction(engine) as conn:
        return Counter(dict(conn.execute(stmt).all()))


def _drive(stack, run_id: str, pool_id: str, queue: str = "bulk") -> None:
    runner = _runner(stack)
    for _ in range(100):
        report = runner.step(run_id)
        if report.state == "completed":
            return
        _finish(stack, queue, pool_id)
    raise AssertionError("the run did not complete")


def _cli_env(engine, redis_url: str, redis_prefix: str, data_dir: Path) -> dict[str, str]:
    """The environment of a `hypermedia bulk ...` command on this test's record and Redis."""
    from tests import support

    return {
        "HYPERMEDIA_DATABASE_URL": support.url_string(engine),
        "HYPERMEDIA_REDIS_URL": redis_url,
        "HYPERMEDIA_REDIS_PREFIX": redis_prefix,
        "HYPERMEDIA_DATA_DIR": str(data_dir),
    }


def test_backfill_streams_within_the_cap_and_runs_twice_without_a_second_job(
    engine, settings, manual_clock
):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack, credits=5)
    objects = _objects(stack, person, 120)
    with transaction(stack.engine) as conn:
        before = accounts.balance(conn, person.caller.user_id)
    service = _service(stack)
    spec = RunSpec(
        kind="backfill",
        operation="thumbnail",
        max_in_flight=50,
        batch_size=20,
        filter={"pool_id": person.pool_id},
    )
    run = service.create(spec, "test")
    assert run.state == "creating" and run.queue == "bulk" and run.priority == 8

    runner = _runner(stack)
    runner.step(run.run_id)
    view = service.get(run.run_id)
    # The cap: 50 live jobs, no more, whatever the pages; all on the bulk queue at 8.
    assert view.created_jobs == 50 and view.jobs == {"queued": 50}
    assert stack.queue.counts("bulk").ready == 50
    runner.step(run.run_id)
    assert service.get(run.run_id).created_jobs == 50  # still no room
    with transaction(stack.engine) as conn:
        rows = conn.execute(
            select(t.jobs.c.user_id, t.jobs.c.priority, t.jobs.c.estimated_millicredits).where(
                t.jobs.c.bulk_run_id == run.run_id
            )
        ).all()
    assert {(r.user_id, r.priority, r.estimated_millicredits) for r in rows} == {
        (PLATFORM_USER_ID, 8, 0)
    }

    _drive(stack, run.run_id, person.pool_id)
    view = service.get(run.run_id)
    assert view.state == "completed" and view.finished_at is not None
    assert view.created_jobs == 120 and view.jobs == {"completed": 120}
    assert view.scanned == 120 and view.skipped == 0
    assert _jobs_per_object(stack.engine) == Counter(dict.fromkeys(objects, 1))
    # The platform paid: the owner's credits are untouched.
    with transaction(stack.engine) as conn:
        assert accounts.balance(conn, person.caller.user_id) == before

    again = service.create(spec, "test")
    _drive(stack, again.run_id, person.pool_id)
    view = service.get(again.run_id)
    assert view.state == "completed"
    assert (view.created_jobs, view.skipped, view.scanned) == (0, 120, 120)
    assert _jobs_per_object(stack.engine) == Counter(dict.fromkeys(objects, 1))


def test_resumed_from_an_old_cursor_it_creates_nothing_twice(engine, settings, manual_clock):
    """What a head killed between its commit and anything after it leaves: a run whose
    jobs exist. A new runner (the restarted head) goes on; even a cursor rewound to the
    start creates no second job for any object."""
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    objects = _objects(stack, person, 60)
    service = _service(stack)
    run = service.create(
        RunSpec(kind="backfill", operation="thumbnail", max_in_flight=1000, batch_size=25),
        "test",
    )
    first = _runner(stack, max_pages_per_tick=1).step(run.run_id)
    assert first.created == 25
    with transaction(stack.engine) as conn:
        conn.execute(
            update(t.bulk_runs).where(t.bulk_runs.c.run_id == run.run_id).values(cursor=None)
        )
    _runner(stack).step(run.run_id)  # a fresh runner: the restarted head
    view = service.get(run.run_id)
    assert view.created_jobs == 60
    assert _jobs_per_object(stack.engine, run.run_id) == Counter(dict.fromkeys(objects, 1))
    assert stack.queue.counts("bulk").ready == 60


def test_a_version_bump_regenerates_exactly_the_missing_outputs(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    objects = _objects(stack, person, 30)
    manual_clock.advance(60)
    untouched = make_object(stack, person)  # never had a thumbnail: not regenerated
    service = _service(stack)
    first = service.create(
        RunSpec(
            kind="backfill",
            operation="thumbnail",
            filter={"created_before": _created_at(stack, untouched)},
        ),
        "test",
    )
    _drive(stack, first.run_id, person.pool_id)
    assert service.get(first.run_id).created_jobs == 30

    # thumbnail v2 (new params), and ten objects already remade at v2 by users' submits.
    profiles = dict(load_profiles(settings().profiles_path, settings().queue_names))
    bumped = profiles["thumbnail"].model_copy(
        update={"version": 2, "params": {**profiles["thumbnail"].params, "quality": 70}}
    )
    with transaction(stack.engine) as conn:
        sync_profiles(conn, {**profiles, "thumbnail": bumped}, stack.clock.now())
    fresh = stack
    fresh.ingest.catalog = ProfileCatalog.load(stack.engine)  # what a restarted head reads
    for object_id in objects[:10]:
        fresh.ingest.submit(
            person.caller, SubmitRequest(object_id=object_id, operations=["thumbnail"])
        )
    _finish(fresh, "images", person.pool_id)

    service = _service(fresh)
    dry = service.estimate(RunSpec(kind="regenerate", operation="thumbnail"))
    assert (dry.objects, dry.skipped) == (20, 10)
    regen = service.create(RunSpec(kind="regenerate", operation="thumbnail"), "test")
    assert regen.target_version == 2
    _drive(fresh, regen.run_id, person.pool_id)
    view = service.get(regen.run_id)
    assert (view.created_jobs, view.skipped, view.scanned) == (20, 10, 30)
    made = _jobs_per_object(fresh.engine, regen.run_id)
    assert set(made) == set(objects[10:])
    # Every object now has exactly one v2 output; the untouched one has none.
    o, j = t.outputs.c, t.jobs.c
    with transaction(fresh.engine) as conn:
        v2 = Counter(
            conn.execute(
                select(j.object_id)
                .join(t.outputs, o.job_id == j.job_id)
                .where(o.profile_version == 2, j.operation == "thumbnail")
            ).scalars()
        )
    assert v2 == Counter(dict.fromkeys(objects, 1))
    again = service.create(RunSpec(kind="regenerate", operation="thumbnail"), "test")
    _runner(fresh).step(again.run_id)
    assert service.get(again.run_id).created_jobs == 0


def _created_at(stack, object_id: str) -> Any:
    with transaction(stack.engine) as conn:
        return conn.execute(
            select(t.objects.c.created_at).where(t.objects.c.object_id == object_id)
        ).scalar_one()


def _backfill_of_40(
    engine, settings, manual_clock
) -> tuple[Any, Any, BulkService, Any, BulkRunner]:
    """A user's 40 objects and a thumbnail backfill of them, 10 in flight, 10 a page."""
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    _objects(stack, person, 40)
    service = _service(stack)
    run = service.create(
        RunSpec(kind="backfill", operation="thumbnail", max_in_flight=10, batch_size=10), "t"
    )
    return stack, person, service, run, _runner(stack)


def test_pause_resume_cancel(engine, settings, manual_clock):
    stack, person, service, run, runner = _backfill_of_40(engine, settings, manual_clock)
    runner.step(run.run_id)
    assert service.act(run.run_id, "pause").state == "paused"
    with pytest.raises(Conflict):
        service.act(run.run_id, "pause")
    _finish(stack, "bulk", person.pool_id)
    runner.step(run.run_id)
    assert service.get(run.run_id).created_jobs == 10  # paused: nothing new
    assert service.act(run.run_id, "resume").state == "creating"
    runner.step(run.run_id)
    assert service.get(run.run_id).created_jobs == 20
    view = service.act(run.run_id, "cancel")
    assert view.state == "cancelled"
    assert view.jobs == {"completed": 10, "cancelled": 10}
    assert stack.queue.counts("bulk").ready == 0
    runner.step(run.run_id)
    assert service.get(run.run_id).created_jobs == 20
    with pytest.raises(Conflict):
        service.act(run.run_id, "resume")


def test_a_running_run_takes_a_new_cap_at_its_next_step(engine, settings, manual_clock):
    """``throttle``: a lower cap creates nothing until fewer jobs are live, a higher one
    fills up to it; a paused run takes one too; a finished run is a Conflict naming its
    state, an unknown one NotFound."""
    stack, person, service, run, runner = _backfill_of_40(engine, settings, manual_clock)
    runner.step(run.run_id)
    assert service.get(run.run_id).created_jobs == 10
    assert service.throttle(run.run_id, 3).max_in_flight == 3
    runner.step(run.run_id)
    assert service.get(run.run_id).created_jobs == 10  # 10 live, over the new cap of 3
    _finish(stack, "bulk", person.pool_id)
    runner.step(run.run_id)
    view = service.get(run.run_id)
    assert (view.created_jobs, view.jobs) == (13, {"completed": 10, "queued": 3})
    service.act(run.run_id, "pause")
    assert service.throttle(run.run_id, 25).max_in_flight == 25
    service.act(run.run_id, "resume")
    runner.step(run.run_id)
    assert service.get(run.run_id).created_jobs == 35  # 25 live now
    service.act(run.run_id, "cancel")
    with pytest.raises(Conflict, match="cannot change a run that is cancelled"):
        service.throttle(run.run_id, 5)
    assert service.get(run.run_id).max_in_flight == 25
    with pytest.raises(NotFound):
        service.throttle("0" * 32, 5)


def test_a_named_account_pays_and_a_short_one_pauses_the_run(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    _objects(stack, person, 30)  # 1 KB each: thumbnail estimate 0.1 + 0.02/1024 -> 101 mc
    payer, service, run = _paid_run(stack, person, 1.0, batch_size=9)  # 1000 mc: 9 jobs
    _runner(stack, max_pages_per_tick=5).step(run.run_id)
    view = service.get(run.run_id)
    assert view.state == "paused" and "short" in (view.reason or "")
    assert view.created_jobs == 9
    with transaction(stack.engine) as conn:
        assert accounts.balance(conn, payer.caller.user_id).reserved_millicredits == 9 * 101
    with transaction(stack.engine) as conn:
        users = set(
            conn.execute(
                select(t.jobs.c.user_id).where(t.jobs.c.bulk_run_id == run.run_id)
            ).scalars()
        )
    assert users == {payer.caller.user_id}


def test_a_short_account_gets_the_jobs_it_can_pay_for_before_the_run_pauses(
    engine, settings, manual_clock
):
    """An account with credits for 19 of a page's 30 jobs: the 19 are made (and
    reserved), then the run pauses for the rest; its cursor stops at the 19th object,
    so a resume with more credits goes on from the 20th."""
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    objects = _objects(stack, person, 30)  # 101 mc each (see above)
    payer, service, run = _paid_run(stack, person, 2.0)  # 2000 mc: 19 jobs
    _runner(stack).step(run.run_id)
    view = service.get(run.run_id)
    assert view.state == "paused" and "short" in (view.reason or ""), view
    assert (view.created_jobs, view.scanned, view.cursor) == (19, 19, sorted(objects)[18])
    with transaction(stack.engine) as conn:
        assert accounts.balance(conn, payer.caller.user_id).reserved_millicredits == 19 * 101
    _finish(stack, "bulk", person.pool_id)
    with transaction(stack.engine) as conn:
        accounts.grant_credits(conn, payer.caller.user_id, 2000, manual_clock.now())
    service.act(run.run_id, "resume")
    _drive(stack, run.run_id, person.pool_id)
    assert service.get(run.run_id).jobs == {"completed": 30}
    assert _jobs_per_object(stack.engine, run.run_id) == Counter(dict.fromkeys(objects, 1))


def test_an_ocr_run_reserves_and_charges_as_a_submit_does(engine, settings, manual_clock):
    """ocr prices its escalations: each job of a run reserves its estimate plus the most
    the input may escalate (a 1 KB image: 1.001 + 2 x 0.25), on the named account as a
    submit would, so an account holding two jobs' worst case gets two jobs and a pause;
    completed past their bound, they are charged their reservations, never more, and
    the balance ends at 0. A platform run holds no credits, but its jobs record the
    same bound on what the platform's ledger may be charged."""
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    for _ in range(3):
        make_object(stack, person, inspection=image_inspection())
    payer, service, run = _paid_run(stack, person, 2 * 1.501, "ocr", batch_size=1)
    _runner(stack, max_pages_per_tick=5).step(run.run_id)
    view = service.get(run.run_id)
    assert view.state == "paused" and "this needs 1.501 reserved" in (view.reason or "")
    assert view.created_jobs == 2
    with transaction(stack.engine) as conn:
        assert accounts.balance(conn, payer.caller.user_id) == accounts.Balance(3002, 3002)
    catalog = ProfileCatalog.load(stack.engine)
    dispatcher = Dispatcher(stack.engine, stack.queue, catalog, clock=stack.clock)
    jobs = dispatcher.claim_and_start("bulk", "w-test", 10)
    assert [(j.estimated_millicredits, j.reserved_millicredits) for j in jobs] == [(1001, 1501)] * 2
    units = {"page": 1, "ocr_page": 1, "engine_pass": 5, "escalation": 4}  # past its bound
    dispatcher.complete_many(
        "w-test", [FinishedJob(j.job_id, actual_millicredits=2001, units=units) for j in jobs]
    )
    with transaction(stack.engine) as conn:
        assert accounts.balance(conn, payer.caller.user_id) == accounts.Balance(0, 0)
    platform = service.create(
        RunSpec(kind="backfill", operation="ocr", filter={"pool_id": person.pool_id}), "t"
    )
    _runner(stack).step(platform.run_id)
    with transaction(stack.engine) as conn:
        held = conn.execute(
            select(t.jobs.c.estimated_millicredits, t.jobs.c.reserved_millicredits).where(
                t.jobs.c.bulk_run_id == platform.run_id
            )
        ).all()
    assert [tuple(r) for r in held] == [(0, 500)] * 3
    stack.close()


def test_a_named_account_gets_jobs_only_on_objects_it_may_use(engine, settings, manual_clock):
    """The jobs of a run that names an account are the account's: it sees them and
    fetches their outputs. So only objects it may use are dealt with, never another
    user's (an operator's run billed to alice made her the owner of jobs on bob's files,
    their outputs hers to download)."""
    stack = open_stack(settings, engine, manual_clock)
    bob = make_user(stack, name="bob")
    _objects(stack, bob, 3)
    alice = make_user(stack, name="alice", credits=10.0)
    mine = _objects(stack, alice, 2)
    service = _service(stack)
    run = service.create(
        RunSpec(kind="backfill", operation="thumbnail", batch_size=10, account="alice"), "t"
    )
    _runner(stack).step(run.run_id)
    view = service.get(run.run_id)
    assert view.created_jobs == 2, view
    with transaction(stack.engine) as conn:
        objects = set(
            conn.execute(
                select(t.jobs.c.object_id).where(t.jobs.c.bulk_run_id == run.run_id)
            ).scalars()
        )
    assert objects == set(mine)


def test_the_dry_run_of_a_run_that_names_an_account_counts_what_the_run_would(
    engine, settings, manual_clock
):
    """The dry run deals with the objects the named account may use, as the run does:
    the account is named as the run names it (its user name), so the count is not 0."""
    stack = open_stack(settings, engine, manual_clock)
    bob = make_user(stack, name="bob")
    _objects(stack, bob, 3)
    alice = make_user(stack, name="alice", credits=10.0)
    _objects(stack, alice, 2)
    service = _service(stack)
    spec = RunSpec(kind="backfill", operation="thumbnail", batch_size=10, account="alice")
    assert service.estimate(spec).objects == 2
    with pytest.raises(NotFound):
        service.estimate(spec.model_copy(update={"account": "nobody"}))
    run = service.create(spec, "t")
    _runner(stack).step(run.run_id)
    assert service.get(run.run_id).created_jobs == 2


def test_refusals(engine, settings, manual_clock):
    stack = open_stack(settings, engine, manual_clock)
    service = _service(stack)
    with pytest.raises(InvalidRequest):
        service.create(RunSpec(kind="backfill", operation="thumbnail", queue="media"), "t")
    with pytest.raises(ValueError, match="greater than or equal to 7"):
        RunSpec(kind="backfill", operation="thumbnail", priority=3)
    with pytest.raises(ValueError, match="migrate needs a target"):
        RunSpec(kind="migrate", operation="thumbnail")


def test_the_api_is_for_operators_only(pg_engine, settings, manual_clock):
    from hypermedia.ingest.api import create_app

    stack = open_stack(settings, pg_engine, manual_clock)
    person = make_user(stack)
    _objects(stack, person, 5)
    user = add_user(stack, "someone")
    operator = add_user(stack, "root", operator=True)
    client = TestClient(create_app(stack))
    body = {"kind": "backfill", "operation": "thumbnail"}
    url = "/v1/hypermedia/bulk/runs"
    refused = client.post(url, json=body, headers=bearer(user))
    assert refused.status_code == 403
    assert client.get(url, headers=bearer(user)).status_code == 403
    dry = client.post(url, json={**body, "dry_run": True}, headers=bearer(operator))
    assert dry.status_code == 200 and dry.json()["objects"] == 5
    # The estimate alone, as the README lists it: the simulation is the CLI's only.
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    listed = readme.split("has no simulation: it answers\nthe estimate alone (")[1]
    assert sorted(dry.json()) == sorted(re.findall(r"`(\w+)`", listed.split(")")[0]))
    with transaction(stack.engine) as conn:
        assert conn.execute(select(func.count()).select_from(t.bulk_runs)).scalar_one() == 0
    created = client.post(url, json=body, headers=bearer(operator))
    assert created.status_code == 200, created.text
    run_id = created.json()["run_id"]
    assert client.post(f"{url}/{run_id}/pause", headers=bearer(user)).status_code == 403
    paused = client.post(f"{url}/{run_id}/pause", headers=bearer(operator))
    assert paused.json()["state"] == "paused"
    assert client.post(f"{url}/{run_id}/pause", headers=bearer(operator)).status_code == 409
    assert client.get(f"{url}/{run_id}", headers=bearer(operator)).json()["run_id"] == run_id
    assert client.get(f"{url}/{'0' * 32}", headers=bearer(operator)).status_code == 404
    malformed = client.get(f"{url}/nope", headers=bearer(operator))  # not an id we make
    assert malformed.status_code == 422 and "path.run_id" in malformed.json()["error"]["message"]
    assert (
        client.post(url, json={**body, "priority": 2}, headers=bearer(operator)).status_code == 422
    )
    with transaction(stack.engine) as conn:
        assert runs.view(conn, run_id).created_by == f"api:{operator.user_id}"
    # PATCH: the cap of a run that runs or is paused; nothing else may change.
    patched = client.patch(f"{url}/{run_id}", json={"max_in_flight": 7}, headers=bearer(operator))
    assert (patched.status_code, patched.json()["max_in_flight"]) == (200, 7), patched.text
    assert (
        client.patch(f"{url}/{run_id}", json={"max_in_flight": 8}, headers=bearer(user))
    ).status_code == 403
    for bad in ({"max_in_flight": 0}, {"max_in_flight": 7, "priority": 9}, {}):
        refused = client.patch(f"{url}/{run_id}", json=bad, headers=bearer(operator))
        assert refused.status_code == 422, (bad, refused.text)
    assert client.get(f"{url}/{run_id}", headers=bearer(operator)).json()["max_in_flight"] == 7
    gone = client.patch(f"{url}/{'0' * 32}", json={"max_in_flight": 7}, headers=bearer(operator))
    assert gone.status_code == 404
    client.post(f"{url}/{run_id}/cancel", headers=bearer(operator))
    finished = client.patch(f"{url}/{run_id}", json={"max_in_flight": 9}, headers=bearer(operator))
    assert finished.status_code == 409 and "cancelled" in finished.json()["error"]["message"]


def test_a_runs_status_says_its_total_share_rate_and_eta(
    engine, settings, manual_clock, tmp_path, redis_url, redis_prefix
):
    """A run's status said what it had scanned and no more: no total, no share, no ETA,
    so an operator could not tell how far a long run was. Now the create counts its
    selection once (``total``) and the run (API, ``bulk status``) says ``progress``:
    done, failed, in flight, remaining, percent, its jobs' rate over the last 10 minutes
    and the ETA at that rate."""
    from typer.testing import CliRunner

    from hypermedia.cli import app
    from hypermedia.ingest.api import create_app

    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    _objects(stack, person, 10)
    operator = add_user(stack, "ops-progress", operator=True)
    client = TestClient(create_app(stack))
    url = "/v1/hypermedia/bulk/runs"
    body = {"kind": "backfill", "operation": "thumbnail", "max_in_flight": 4, "batch_size": 4}
    created = client.post(url, json=body, headers=bearer(operator)).json()
    run_id = created["run_id"]
    assert created["total"] == 10
    assert created["progress"] == {
        "total": 10,
        "done": 0,
        "failed": 0,
        "in_flight": 0,
        "remaining": 10,
        "percent": 0.0,
        "jobs_per_second": None,
        "eta_seconds": None,
    }
    runner = _runner(stack)
    runner.step(run_id)
    manual_clock.advance(100)
    assert _finish(stack, "bulk", person.pool_id) == 4
    runner.step(run_id)  # 4 more queued
    shown = client.get(f"{url}/{run_id}", headers=bearer(operator)).json()["progress"]
    # 4 ended in the 100 s since the create: 0.04 a second; left: 4 queued and 2
    # unscanned (at 8 jobs for 8 objects): 6 / 0.04
    assert shown == {
        "total": 10,
        "done": 4,
        "failed": 0,
        "in_flight": 4,
        "remaining": 6,
        "percent": 40.0,
        "jobs_per_second": 0.04,
        "eta_seconds": 150.0,
    }
    listed = client.get(url, headers=bearer(operator)).json()["runs"]
    assert listed[0]["progress"]["percent"] == 40.0

    env = _cli_env(engine, redis_url, redis_prefix, tmp_path)
    cli = CliRunner()
    out = cli.invoke(app, ["bulk", "status", run_id], env=env)
    assert out.exit_code == 0, (out.output, out.exception)
    assert "  progress 40.0%: 4 of 10 objects (4 done, 0 failed, 6 remaining)" in out.stdout
    out = cli.invoke(app, ["bulk", "status", run_id, "--json"], env=env)
    assert json.loads(out.stdout)[0]["progress"]["remaining"] == 6

    # --follow: a bar until it completes (exit 0), one JSON line a read with --json
    _drive(stack, run_id, person.pool_id)
    out = cli.invoke(app, ["bulk", "status", run_id, "--follow"], env=env)
    assert out.exit_code == 0, (out.output, out.exception)
    assert "100.0%" in out.stdout and "10/10" in out.stdout and "completed" in out.stdout
    out = cli.invoke(app, ["bulk", "status", run_id, "--follow", "--json"], env=env)
    assert out.exit_code == 0, (out.output, out.exception)
    (line,) = out.stdout.splitlines()
    assert json.loads(line)["progress"]["percent"] == 100.0
    assert cli.invoke(app, ["bulk", "status", "--follow"], env=env).exit_code == 2
    stack.close()


def _uncounted_then_counted(uncounted: Any, counted: Any, total: int) -> None:
    """The run created while its count could not end: no total, still creating; the
    same selection's next create: counted, nothing done yet."""
    assert (uncounted.total, uncounted.progress.total, uncounted.state) == (
        None,
        None,
        "creating",
    )
    assert (counted.total, counted.progress.percent) == (total, 0.0)


def test_a_selection_too_big_to_count_in_time_is_created_without_a_total(
    pg_engine, settings, manual_clock, monkeypatch
):
    """The create counted its selection in one statement under the engine's statement
    limit (30 s): measured on PostgreSQL (2 cores, 3M objects with a job and an output
    each), a backfill's COUNT 3-8M objects a second, a regenerate's 0.7-1.2M, so the
    create of a regenerate over some 25M objects answered 503 database_unavailable, as
    every create asked again (3M under a limit of 1 s: so). The count gets
    COUNT_SECONDS now (5 s, the statement limit when less), in a savepoint: a selection
    not counted by then is created without a total (its scan ends with one), the create
    answered all the same.

    A count that cannot end in time on any machine, fast or loaded: another session
    holds the objects table (ACCESS EXCLUSIVE, as an ALTER TABLE would), so the count
    waits for it until COUNT_SECONDS (0.2 s here) cancels it, well before the engine's
    lock limit (10 s). (Timing a real count of 300k objects, 40-100 ms, against 10 ms
    failed now and then: which side of 10 ms it fell on was the machine's.) Then, the
    table let go, the same selection counted within the product's own COUNT_SECONDS."""
    stack = open_stack(settings, pg_engine, manual_clock)
    try:
        person = make_user(stack)
        _objects(stack, person, 3)
        service = _service(stack)
        spec = RunSpec(kind="backfill", operation="thumbnail", filter={"pool_id": person.pool_id})
        with monkeypatch.context() as patched, stack.engine.connect() as other:
            patched.setattr(runs, "COUNT_SECONDS", 0.2, raising=False)
            holding = other.begin()
            other.exec_driver_sql("LOCK TABLE objects IN ACCESS EXCLUSIVE MODE")
            try:
                uncounted = service.create(spec, "t")
            finally:
                holding.rollback()
        counted = service.create(spec, "t")
    finally:
        stack.close()
    # Old: counted whatever it took, here waiting on the table until the engine's lock
    # limit: DatabaseUnavailable (lock timeout, 55P03), the API's 503.
    _uncounted_then_counted(uncounted, counted, 3)


def test_a_sqlite_count_past_its_time_is_interrupted_and_the_run_created_without_a_total(
    sqlite_engine, settings, manual_clock, monkeypatch
):
    """On SQLite the create counted its selection inside its write transaction for as
    long as the count took, every other writer of the record (submits, claims,
    completions) waiting on it and failing SQLITE_BUSY past 30 s. SQLite's progress
    handler now interrupts it at COUNT_SECONDS: the run is created without a total
    (its scan ends with one), the transaction and the create go on.

    A count that cannot end in time on any machine: COUNT_SECONDS 0 with the handler
    looked at after every virtual-machine step, so the count's first steps find its
    time up. Then the same selection counted within the product's own COUNT_SECONDS."""
    stack = open_stack(settings, sqlite_engine, manual_clock)
    try:
        person = make_user(stack)
        _objects(stack, person, 3)
        service = _service(stack)
        spec = RunSpec(kind="backfill", operation="thumbnail", filter={"pool_id": person.pool_id})
        with monkeypatch.context() as patched:
            patched.setattr(runs, "COUNT_SECONDS", 0.0, raising=False)
            patched.setattr(runs, "_SQLITE_PROGRESS_STEPS", 1, raising=False)
            uncounted = service.create(spec, "t")
        counted = service.create(spec, "t")
        with stack.engine.connect() as conn:
            rows = conn.execute(select(func.count()).select_from(t.bulk_runs)).scalar_one()
    finally:
        stack.close()
    # Old: counted whatever it took (3 here, the write lock held meanwhile).
    _uncounted_then_counted(uncounted, counted, 3)
    assert rows == 2  # both created: the interrupted count lost nothing of the create


def test_a_count_limit_under_a_millisecond_is_one_not_none(pg_engine):
    """_count_within rounded seconds * 1000 to its statement_timeout with no floor: a
    limit under 0.5 ms became statement_timeout 0, which PostgreSQL reads as no limit at
    all, so the count ran as long as it took. Now 1 ms at least (as
    engine.statement_limits): a count of 0.2 s is cancelled (None), and one under the
    session's limit too (min of the two, never 0)."""
    slow = text("SELECT count(*) FROM pg_sleep(0.2)")
    with pg_engine.connect() as conn, conn.begin():
        # Old: statement_timeout 0 (no limit), the sleep counted: 1.
        assert runs._count_within(conn, slow, 0.0004) is None
        conn.exec_driver_sql("SET LOCAL statement_timeout = 30000")
        assert runs._count_within(conn, slow, 0.0001) is None
        assert runs._session_statement_ms(conn) == 30000
        assert runs._count_within(conn, text("SELECT 7"), 5.0) == 7


def test_following_a_run_shows_it_move_and_exits_1_when_it_pauses(
    pg_engine, settings, manual_clock, tmp_path, redis_url, redis_prefix
):
    """``bulk status RUN --follow`` reads the run each --interval while the head works
    (here a thread) and stops when nothing more will move: paused, exit 1 naming it."""
    import threading

    from typer.testing import CliRunner

    from hypermedia.cli import app

    stack = open_stack(settings, pg_engine, manual_clock)
    person = make_user(stack)
    _objects(stack, person, 12)
    service = _service(stack)
    run = service.create(
        RunSpec(kind="backfill", operation="thumbnail", max_in_flight=3, batch_size=3), "t"
    )

    def head() -> None:
        runner = _runner(stack)
        for _ in range(2):  # two pages of 3, each finished, then a pause
            time.sleep(0.2)
            runner.step(run.run_id)
            time.sleep(0.2)
            _finish(stack, "bulk", person.pool_id)
        service.act(run.run_id, "pause")

    worker = threading.Thread(target=head, daemon=True)
    worker.start()
    env = _cli_env(pg_engine, redis_url, redis_prefix, tmp_path)
    args = ["bulk", "status", run.run_id, "--follow", "--json", "--interval", "0.05"]
    out = CliRunner().invoke(app, args, env=env)
    worker.join(10)
    assert out.exit_code == 1, (out.output, out.exception)
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    percents = [line["progress"]["percent"] for line in lines]
    assert percents == sorted(percents) and percents[-1] == 50.0, percents
    assert lines[-1]["state"] == "paused" and len(lines) >= 2
    assert f"run {run.run_id} is paused" in out.stderr
    stack.close()


def test_the_runs_are_listed_a_page_at_a_time(
    engine, settings, manual_clock, tmp_path, redis_url, redis_prefix
):
    """GET /bulk/runs answered the latest 50 runs and no way to the 51st (nor did ``bulk
    status``'s 20); now both page as the jobs list does: ``cursor`` (the page before's
    ``next_cursor``, null on the last) and ``limit`` (1-200, default 50), newest first,
    a run created while paging shifting nothing left to read."""
    from typer.testing import CliRunner

    from hypermedia.cli import app
    from hypermedia.ingest.api import create_app

    stack = open_stack(settings, engine, manual_clock)
    service = _service(stack)
    spec = RunSpec(kind="backfill", operation="thumbnail")
    made = [service.create(spec, "t").run_id for _ in range(52)]
    newest_first = made[::-1]
    operator = add_user(stack, "ops-pages", operator=True)
    client = TestClient(create_app(stack))
    url = "/v1/hypermedia/bulk/runs"

    first = client.get(url, headers=bearer(operator)).json()
    assert [r["run_id"] for r in first["runs"]] == newest_first[:50]
    older = client.get(url, params={"cursor": first["next_cursor"]}, headers=bearer(operator))
    assert [r["run_id"] for r in older.json()["runs"]] == newest_first[50:]
    assert older.json()["next_cursor"] is None
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 20} | ({"cursor": cursor} if cursor else {})
        page = client.get(url, params=params, headers=bearer(operator)).json()
        seen += [r["run_id"] for r in page["runs"]]
        if len(seen) == 20:
            service.create(spec, "t")  # a run created while paging: shifts nothing
        if page["next_cursor"] is None:
            break
        cursor = page["next_cursor"]
    assert seen == newest_first
    for bad in ({"limit": 0}, {"limit": 201}, {"cursor": "nope"}):
        refused = client.get(url, params=bad, headers=bearer(operator))
        assert refused.status_code == 422, (bad, refused.text)

    env = _cli_env(engine, redis_url, redis_prefix, tmp_path)
    runner = CliRunner()
    out = runner.invoke(app, ["bulk", "status", "--limit", "2", "--json"], env=env)
    assert out.exit_code == 0, (out.output, out.exception)
    listed = [r["run_id"] for r in json.loads(out.stdout)]
    assert len(listed) == 2
    assert f"older runs: hypermedia bulk status --cursor {listed[1]}" in out.stderr
    out = runner.invoke(app, ["bulk", "status", "--cursor", made[1]], env=env)
    assert out.exit_code == 0, (out.output, out.exception)
    assert out.stdout.startswith(made[0]) and "older runs" not in out.stderr
    assert runner.invoke(app, ["bulk", "status", "--cursor", made[0]], env=env).stdout == (
        "no older bulk runs\n"
    )
    malformed = runner.invoke(app, ["bulk", "status", "--cursor", "nope"], env=env)
    assert malformed.exit_code == 2 and "Invalid value for '--cursor'" in malformed.output
    stack.close()


# -- migrate: local -> S3 (moto's server mode) ------------------------------------------------


@pytest.fixture
def s3_target(monkeypatch, tmp_path) -> Iterator[dict[str, str]]:
    """A bucket on moto's server; the head's S3 credentials from its environment."""
    import boto3

    from tests import support

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing-secret")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    with support.moto_server() as url:
        bucket = "hm-bulk-migrate"
        boto3.client("s3", endpoint_url=url, region_name="us-east-1").create_bucket(Bucket=bucket)
        yield {"bucket": bucket, "endpoint_url": url, "region": "us-east-1"}


def test_migrate_local_to_s3_switches_each_record_after_its_copy_is_verified(
    engine, settings, manual_clock, s3_target
):
    import hashlib

    from hypermedia.storage.s3 import S3Storage
    from tests.factories import stored_object

    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    payloads = {
        stored_object(stack, person, f"object {i}".encode() * (i + 1)): i for i in range(12)
    }
    ids = sorted(payloads)
    with transaction(stack.engine) as conn:
        for object_id in ids:
            data = f"object {payloads[object_id]}".encode() * (payloads[object_id] + 1)
            conn.execute(
                update(t.objects)
                .where(t.objects.c.object_id == object_id)
                .values(sha256=hashlib.sha256(data).hexdigest())
            )
        # One whose bytes were altered behind the record's back, one whose bytes are gone.
        conn.execute(
            update(t.objects).where(t.objects.c.object_id == ids[3]).values(sha256="0" * 64)
        )
        # Its copy is stored as the recorded type (S3 stored none: binary/octet-stream);
        # a type no store takes is not one (then as with none).
        types = {ids[0]: "image/png", ids[1]: "text/plain; charset=latin-1"}
        for object_id, content_type in types.items():
            conn.execute(
                update(t.objects)
                .where(t.objects.c.object_id == object_id)
                .values(content_type=content_type)
            )
        gone_key = conn.execute(
            select(t.objects.c.storage_key).where(t.objects.c.object_id == ids[7])
        ).scalar_one()
    stack.storage.delete(gone_key)

    service = _service(stack)
    spec = RunSpec(kind="migrate", target=s3_target, batch_size=5)
    assert service.estimate(spec).objects == 12
    run = service.create(spec, "test")
    runner = BulkRunner(stack.engine, stack.queue, storage=stack.storage, clock=stack.clock)
    for _ in range(10):
        if runner.step(run.run_id).state == "completed":
            break
    view = service.get(run.run_id)
    assert (view.state, view.migrated, view.failed, view.scanned) == ("completed", 10, 2, 12)
    target = S3Storage(
        s3_target["bucket"], endpoint_url=s3_target["endpoint_url"], region="us-east-1"
    )
    name = runs.MigrateTarget.model_validate(s3_target).name
    with transaction(stack.engine) as conn:
        rows = conn.execute(
            select(t.objects.c.object_id, t.objects.c.storage_key, t.objects.c.storage_backend)
            .where(t.objects.c.object_id.in_(ids))
            .order_by(t.objects.c.object_id)
        ).all()
    for row in rows:
        if row.object_id in (ids[3], ids[7]):
            assert row.storage_backend is None  # not verified: not switched
            continue
        assert row.storage_backend == name
        i = payloads[row.object_id]
        assert b"".join(target.read(row.storage_key)) == f"object {i}".encode() * (i + 1)
        stored = target.client.head_object(Bucket=target.bucket, Key=row.storage_key)
        expected = "image/png" if row.object_id == ids[0] else "application/octet-stream"
        assert stored["ContentType"] == expected, row.object_id
    # Again: only the two left behind are tried, nothing is copied twice.
    again = service.create(spec, "test")
    for _ in range(5):
        if runner.step(again.run_id).state == "completed":
            break
    view = service.get(again.run_id)
    assert (view.scanned, view.migrated, view.failed) == (2, 0, 2)


def test_deleting_a_migrated_object_deletes_its_copy_where_it_was_migrated_to(
    engine, settings, manual_clock, s3_target
):
    """A migrated object's copy in the target bucket goes with it (the API's delete, and
    the sweep of a deletion the API did not get to), as does the original the migration
    left in the server's storage."""
    from hypermedia.ingest.api import create_app
    from hypermedia.server import Maintenance
    from hypermedia.storage import deletions
    from hypermedia.storage.s3 import S3Storage
    from tests.factories import stored_object

    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    ids = [stored_object(stack, person, f"object {i}".encode()) for i in range(3)]
    spec = RunSpec(kind="migrate", target=s3_target)
    run = _service(stack).create(spec, "test")
    runner = BulkRunner(stack.engine, stack.queue, storage=stack.storage, clock=stack.clock)
    assert runner.step(run.run_id).migrated == 3
    target = S3Storage(
        s3_target["bucket"], endpoint_url=s3_target["endpoint_url"], region="us-east-1"
    )
    o = t.objects.c
    with transaction(stack.engine) as conn:
        keys = dict(
            conn.execute(select(o.object_id, o.storage_key).where(o.object_id.in_(ids))).all()
        )
    assert all(target.exists(keys[i]) and stack.storage.exists(keys[i]) for i in ids)

    client = TestClient(create_app(stack))
    headers = {"Authorization": f"Bearer {person.api_key}"}
    deleted = client.delete(f"/v1/hypermedia/objects/{ids[0]}", headers=headers)
    assert deleted.status_code == 200, deleted.text
    # One whose deletion committed but whose blobs the API never tried (it died).
    with transaction(stack.engine) as conn:
        deletion = plan_deletion(conn, person.caller, ids[1])
        mark_deleted(conn, deletion, manual_clock.now())
        deletions.record(conn, ids[1], deletion.storage_keys, manual_clock.now())
    manual_clock.advance(deletions.FIRST_TRY_SECONDS)
    Maintenance(stack, reaper_interval=1, reconcile_interval=60).sweep_blobs()

    for object_id in ids[:2]:
        assert not target.exists(keys[object_id]), object_id
        assert not stack.storage.exists(keys[object_id]), object_id
    assert target.exists(keys[ids[2]]) and stack.storage.exists(keys[ids[2]])
    with transaction(stack.engine) as conn:
        assert deletions.pending(conn, manual_clock.now()).count == 0
    stack.close()


def test_an_object_deleted_while_its_copy_is_made_has_the_copy_deleted_too(
    engine, settings, manual_clock, s3_target
):
    """Deleted between its copy's write and its record's switch: the deletion recorded no
    copy (its row said none), so the switch, finding it deleted, records the copy's."""
    from hypermedia.bulk.runner import open_target
    from hypermedia.server import Maintenance
    from hypermedia.storage import deletions
    from tests.factories import stored_object

    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    object_id = stored_object(stack, person, b"deleted while copied")
    opened = []

    class DeletedWhileCopied:
        """The target; its read-back deletes the object (as its owner's DELETE would)."""

        def __init__(self, storage) -> None:
            self.storage = storage

        def __getattr__(self, name: str) -> Any:
            return getattr(self.storage, name)

        def read(self, key: str, chunk_size: int = 1 << 20):
            uploads.delete_object(
                stack.engine,
                stack.storage,
                stack.queue,
                stack.ingest.events,
                person.caller,
                object_id,
                manual_clock,
            )
            return self.storage.read(key, chunk_size)

    def target_storage(spec: dict[str, Any]) -> Any:
        opened.append(open_target(spec))
        return DeletedWhileCopied(opened[-1])

    run = _service(stack).create(RunSpec(kind="migrate", target=s3_target), "test")
    runner = BulkRunner(
        stack.engine,
        stack.queue,
        storage=stack.storage,
        clock=stack.clock,
        target_storage=target_storage,
    )
    runner.step(run.run_id)
    with transaction(stack.engine) as conn:
        key, backend = conn.execute(
            select(t.objects.c.storage_key, t.objects.c.storage_backend).where(
                t.objects.c.object_id == object_id
            )
        ).one()
    assert backend is None  # not switched
    assert opened[0].exists(key)
    manual_clock.advance(deletions.FIRST_TRY_SECONDS)
    Maintenance(stack, reaper_interval=1, reconcile_interval=60).sweep_blobs()
    assert not opened[0].exists(key) and not stack.storage.exists(key)
    stack.close()


# -- the CLI's dry run: count, CPU time, and the simulator under scheduler.json ---------------


def _scheduler_json(tmp_path, mode: str) -> str:
    import json

    from hypermedia.etc import shipped_etc

    config = json.loads((shipped_etc() / "scheduler.json").read_text())
    config["mode"] = mode
    if mode != "vps_only":
        config["queues"]["bulk"].update(cloud_enabled=True, cloud_provider="aws")
        config["cloud_providers"]["aws"].update(enabled=True, ami_id="ami-0123456789abcdef0")
    path = tmp_path / f"scheduler-{mode}.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_dry_run_counts_estimates_and_simulates_without_writing(
    pg_engine, settings, manual_clock, tmp_path, redis_url, redis_prefix
):
    import json

    from typer.testing import CliRunner

    from hypermedia.cli import app

    stack = open_stack(settings, pg_engine, manual_clock)
    person = make_user(stack)
    _objects(stack, person, 40)
    # History: ten thumbnails done by users' submits, 2 s each.
    for object_id in _objects(stack, person, 10):
        stack.ingest.submit(
            person.caller, SubmitRequest(object_id=object_id, operations=["thumbnail"])
        )
    _finish(stack, "images", person.pool_id)
    with transaction(stack.engine) as conn:
        conn.execute(update(t.attempts).values(duration_ms=2000))
    env = _cli_env(pg_engine, redis_url, redis_prefix, tmp_path)
    runner = CliRunner()
    results = {}
    for mode in ("vps_only", "hybrid"):
        out = runner.invoke(
            app,
            [
                "bulk",
                "backfill",
                "thumbnail",
                "--dry-run",
                "--json",
                "--scheduler-config",
                _scheduler_json(tmp_path, mode),
            ],
            env=env,
        )
        assert out.exit_code == 0, out.output
        results[mode] = json.loads(out.stdout)
    hybrid, vps = results["hybrid"], results["vps_only"]
    assert (hybrid["objects"], hybrid["skipped"]) == (40, 10)
    assert hybrid["cpu_seconds"] == pytest.approx(80.0)
    # hybrid with bulk on the cloud: the bulk queue at 8, sent to the cloud at a cost.
    assert (hybrid["queue"], hybrid["priority"]) == ("bulk", 8)
    assert hybrid["simulation"]["unfinished"] == 0
    assert hybrid["simulation"]["cloud_cost_cents"] > 0
    assert 0 < hybrid["simulation"]["duration_seconds"] < 24 * 3600
    # vps_only with no bulk worker: the images queue at 10, on the VPS, at no cost.
    assert (vps["queue"], vps["priority"], vps["objects"]) == ("images", 10, 40)
    assert vps["simulation"]["unfinished"] == 0 and vps["simulation"]["cloud_cost_cents"] == 0
    with transaction(stack.engine) as conn:
        assert conn.execute(select(func.count()).select_from(t.bulk_runs)).scalar_one() == 0

    text = runner.invoke(
        app,
        [
            "bulk",
            "backfill",
            "thumbnail",
            "--dry-run",
            "--scheduler-config",
            _scheduler_json(tmp_path, "vps_only"),
        ],
        env=env,
    )
    assert "40 jobs to create" in text.stdout and "no worker" in text.output
    created = runner.invoke(
        app,
        [
            "bulk",
            "backfill",
            "thumbnail",
            *("--queue", "bulk", "--max-in-flight", "7"),
            *("--scheduler-config", _scheduler_json(tmp_path, "hybrid")),
        ],
        env=env,
    )
    assert created.exit_code == 0, created.output
    run_id = created.stdout.split()[0]
    status = runner.invoke(app, ["bulk", "status", run_id, "--json"], env=env)
    shown = json.loads(status.stdout)[0]
    assert (shown["max_in_flight"], shown["queue"], shown["priority"]) == (7, "bulk", 8)
    paused = runner.invoke(app, ["bulk", "pause", run_id], env=env)
    assert "paused" in paused.stdout
    again = runner.invoke(app, ["bulk", "pause", run_id], env=env)
    assert again.exit_code != 0


def test_a_migrate_dry_run_says_what_it_counts_and_nothing_it_does_not(
    pg_engine, settings, manual_clock, tmp_path, redis_url, redis_prefix
):
    """`bulk migrate --dry-run` counts the objects not at the bucket yet and their bytes:
    no CPU time, no cloud cost, no duration (no job runs), and no skipped or unfit
    objects (those already there are left out, not skipped). Its help says so."""
    import typer.main
    from typer.testing import CliRunner

    from hypermedia.cli import app

    stack = open_stack(settings, pg_engine, manual_clock)
    person = make_user(stack)
    ids = _objects(stack, person, 5)
    target = runs.MigrateTarget(bucket="hm-archive", prefix="old")
    with transaction(stack.engine) as conn:  # one copied there already
        conn.execute(
            update(t.objects)
            .where(t.objects.c.object_id == ids[0])
            .values(storage_backend=target.name)
        )
        size = int(
            conn.execute(
                select(func.sum(t.objects.c.size_bytes)).where(t.objects.c.object_id.in_(ids[1:]))
            ).scalar_one()
        )
    env = _cli_env(pg_engine, redis_url, redis_prefix, tmp_path)
    args = ["bulk", "migrate", "--to-bucket", "hm-archive", "--to-prefix", "old", "--dry-run"]
    out = CliRunner().invoke(app, args, env=env)
    assert out.exit_code == 0, out.output
    assert out.stdout.splitlines() == [
        f"migrate to s3:hm-archive/old: 4 objects to copy ({size / 1e6:.1f} MB);"
        " those already there are not counted"
    ]
    as_json = json.loads(CliRunner().invoke(app, [*args, "--json"], env=env).stdout)
    assert (as_json["objects"], as_json["bytes"], as_json["cpu_seconds"]) == (4, size, None)
    with transaction(stack.engine) as conn:
        assert conn.execute(select(func.count()).select_from(t.bulk_runs)).scalar_one() == 0

    command = typer.main.get_command(app).commands["bulk"].commands["migrate"]  # type: ignore[attr-defined]
    (option,) = [p for p in command.params if p.name == "dry_run"]
    assert option.help is not None
    for reported in ("objects", "not at the bucket yet", "size"):
        assert reported in option.help
    for unreported in ("CPU", "cost", "duration"):
        assert unreported not in option.help


def test_metrics_and_the_status_show_unfinished_runs(engine, settings, manual_clock):
    from autoscaler import config as scheduler_config
    from autoscaler.status import gather
    from hypermedia.metrics.head import HeadMetrics

    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    _objects(stack, person, 12)
    service = _service(stack)
    run = service.create(RunSpec(kind="backfill", operation="thumbnail", max_in_flight=5), "t")
    _runner(stack).step(run.run_id)
    metrics = HeadMetrics()
    metrics.watch(stack.queue, stack.engine, stack.clock)
    text = metrics.exposition().decode()
    for count in ("created", "live"):
        line = (
            f'hypermedia_bulk_run_objects{{count="{count}",kind="backfill",'
            'operation="thumbnail",state="creating"} 5.0'
        )
        assert line in text
    (shown,) = gather(stack, scheduler_config.load(None)).bulk
    assert (shown.run_id, shown.state, shown.counts["created"], shown.counts["live"]) == (
        run.run_id,
        "creating",
        5,
        5,
    )
    service.act(run.run_id, "cancel")
    assert gather(stack, scheduler_config.load(None)).bulk == []
    assert "hypermedia_bulk_run_objects{" not in metrics.exposition().decode()


def test_filters_by_detected_kind_and_counts_what_the_operation_refuses(
    engine, settings, manual_clock
):
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    images = _objects(stack, person, 3)
    pdfs = _objects(stack, person, 2)
    inspected = {
        **{i: {"kind": "image", "mime": "image/jpeg", "details": {}} for i in images},
        **{p: {"kind": "pdf", "mime": "application/pdf", "details": {}} for p in pdfs},
    }
    with transaction(stack.engine) as conn:
        for object_id, inspection in inspected.items():
            conn.execute(
                update(t.objects)
                .where(t.objects.c.object_id == object_id)
                .values(inspection=inspection)
            )
    service = _service(stack)
    every = service.create(RunSpec(kind="backfill", operation="thumbnail"), "t")
    _runner(stack).step(every.run_id)
    view = service.get(every.run_id)
    # A thumbnail of a PDF is refused at submit (input_type_mismatch): counted, not made.
    assert (view.created_jobs, view.unfit, view.scanned) == (3, 2, 5)
    assert set(_jobs_per_object(stack.engine, every.run_id)) == set(images)
    only_pdfs = service.estimate(
        RunSpec(kind="backfill", operation="pdf_preview", filter={"detected_kind": "pdf"})
    )
    assert (only_pdfs.objects, only_pdfs.unfit) == (2, 0)


def test_jobs_committed_while_redis_is_down_reach_it_by_the_reconciler(
    pg_engine, settings, manual_clock, private_redis
):
    """What a head killed between a page's commit and its push leaves: jobs queued in the
    record that Redis lacks. The run goes on; the reconciler pushes them, once each."""
    from hypermedia.jobs.reaper import reconcile

    stack = open_stack(settings, pg_engine, manual_clock, redis_url=private_redis.url)
    person = make_user(stack)
    _objects(stack, person, 30)
    service = _service(stack)
    run = service.create(RunSpec(kind="backfill", operation="thumbnail", batch_size=10), "t")
    private_redis.kill()
    report = _runner(stack).step(run.run_id)
    assert report.created == 30 and service.get(run.run_id).jobs == {"queued": 30}
    private_redis.restart()
    assert stack.queue.counts("bulk").ready == 0
    assert reconcile(stack.engine, stack.queue).total_restored == 30
    assert stack.queue.counts("bulk").ready == 30
    _drive(stack, run.run_id, person.pool_id)
    assert service.get(run.run_id).jobs == {"completed": 30}
    stack.close()


def test_two_heads_driving_one_run_never_pass_its_cap(engine, settings, manual_clock):
    """A head counts the run's room at the start of its step; a second head that makes
    pages meanwhile (a handover's overlap) must not let the first use that room again."""
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    _objects(stack, person, 60)
    spec = RunSpec(
        kind="backfill",
        operation="thumbnail",
        max_in_flight=20,
        batch_size=5,
        filter={"pool_id": person.pool_id},
    )
    run = _service(stack).create(spec, "test")

    class Overlapped(BulkRunner):
        """A head whose first page comes after another head's whole step."""

        other: BulkRunner | None = None

        def _one_page(self, *args: Any, **kwargs: Any) -> Any:
            if self.other is not None:
                other, self.other = self.other, None
                assert other.step(run.run_id).created == 20  # the whole room
            return super()._one_page(*args, **kwargs)

    first = Overlapped(stack.engine, stack.queue, clock=stack.clock)
    first.other = _runner(stack)
    assert first.step(run.run_id).created == 0
    with transaction(stack.engine) as conn:
        assert runs.live_jobs(conn, run.run_id) == 20
    assert stack.queue.counts("bulk").ready == 20


def test_a_cancel_between_a_pages_commit_and_its_push_leaves_no_ready_job(
    engine, settings, manual_clock
):
    """A run cancelled after a page's jobs committed but before they reached Redis: the
    cancel's removal ran before the push, which then put the cancelled jobs in the ready
    set, where the scheduler reads its depth (Redis's, not the record's): 12 jobs that
    will never run read as demand for a burst worker until the reconciler's next pass
    (60 s). The cancel's removal now leaves tombstones the push honours."""
    from autoscaler.policy import table_row
    from autoscaler.scheduler import queue_state

    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    _objects(stack, person, 12)
    service = _service(stack)
    run = service.create(RunSpec(kind="backfill", operation="thumbnail", batch_size=12), "t")
    push = stack.queue.enqueue

    def cancelled_first(name: str, entries: Any) -> int:
        assert service.act(run.run_id, "cancel").jobs == {"cancelled": 12}
        return push(name, entries)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stack.queue, "enqueue", cancelled_first)
        assert _runner(stack).step(run.run_id).created == 12
    assert service.get(run.run_id).jobs == {"cancelled": 12}
    seen = queue_state(stack.queue, "bulk", time.time())  # ids are stamped by the wall clock
    assert (seen.depth, table_row(seen.depth, seen.oldest_age_seconds).burst) == (0, 0)
    assert stack.queue.counts("bulk").ready == 0
    stack.close()


def test_cancelling_a_run_ends_its_jobs_event_streams(engine, settings, manual_clock):
    """A run's jobs cancelled with it get their `cancelled` status event, as a user's
    cancel gives: nothing was published, so a follower (the run's named account) saw the
    end only at the stream's next read of the record (15 s), and a stream with earlier
    events was kept a day instead of ten minutes."""
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    _objects(stack, person, 2)
    service = _service(stack)
    run = service.create(RunSpec(kind="backfill", operation="thumbnail", max_in_flight=10), "t")
    _runner(stack).step(run.run_id)
    with transaction(stack.engine) as conn:
        job_ids = list(
            conn.execute(select(t.jobs.c.job_id).where(t.jobs.c.bulk_run_id == run.run_id))
            .scalars()
            .all()
        )
    assert len(job_ids) == 2
    assert service.act(run.run_id, "cancel").jobs == {"cancelled": 2}
    events = stack.dispatcher.events
    for job_id in job_ids:
        assert [e["status"] for _, e in events.history(job_id)] == ["cancelled"]
        assert 0 < events.client.ttl(events.key(job_id)) <= events.ended_ttl_seconds


def test_the_owner_deletes_an_object_a_run_has_jobs_on(engine, settings, manual_clock):
    """A bulk run's jobs are the platform's: their object's owner can neither see nor
    cancel them. Before, deleting the object answered 409 'cancel them first' (naming
    job ids the owner then got 404 for) as long as the run's job waited on a queue that
    might have no worker for hours. Now the deletion cancels the queued ones and goes
    on; a running one is asked to stop (the deletion waits for it, as for any job)."""
    stack = open_stack(settings, engine, manual_clock)
    person, stranger = make_user(stack), make_user(stack)
    running, queued, kept = _objects(stack, person, 3)  # ids are time-ordered
    service = _service(stack)
    run = service.create(RunSpec(kind="backfill", operation="thumbnail", max_in_flight=10), "t")
    _runner(stack).step(run.run_id)
    assert service.get(run.run_id).jobs == {"queued": 3}
    dispatcher = Dispatcher(
        stack.engine, stack.queue, ProfileCatalog.load(stack.engine), clock=stack.clock
    )
    (claimed,) = dispatcher.claim_and_start("bulk", "w-test", 1)
    assert claimed.object_id == running
    j = t.jobs.c

    def job_of(object_id: str) -> Any:
        with transaction(stack.engine) as conn:
            return conn.execute(
                select(j.job_id, j.status, j.cancel_requested).where(j.object_id == object_id)
            ).one()

    with pytest.raises(NotFound):  # not the stranger's: nothing cancelled
        uploads.delete_object(
            stack.engine,
            stack.storage,
            stack.queue,
            stack.ingest.events,
            stranger.caller,
            queued,
            manual_clock,
        )
    assert job_of(queued).status == "queued"
    uploads.delete_object(
        stack.engine,
        stack.storage,
        stack.queue,
        stack.ingest.events,
        person.caller,
        queued,
        manual_clock,
    )
    assert job_of(queued).status == "cancelled"
    with pytest.raises(Conflict):
        uploads.delete_object(
            stack.engine,
            stack.storage,
            stack.queue,
            stack.ingest.events,
            person.caller,
            running,
            manual_clock,
        )
    assert job_of(running).cancel_requested  # committed, though the deletion waits
    assert job_of(kept).status == "queued"
    assert service.get(run.run_id).jobs == {"queued": 1, "cancelled": 1, "processing": 1}


def test_deleting_an_object_ends_its_bulk_jobs_event_streams(engine, settings, manual_clock):
    """DELETE /objects/{id} cancels the bulk runs' queued jobs on the object: each gets
    its `cancelled` status event and leaves its Redis queue, as a run's cancel does.
    Before, nothing was published (a follower saw the end only at its stream's next read
    of the record) and the job stayed ready in Redis until the reconciler's next pass."""
    from hypermedia.ingest.api import create_app

    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    (object_id,) = _objects(stack, person, 1)
    run = _service(stack).create(
        RunSpec(kind="backfill", operation="thumbnail", max_in_flight=10), "t"
    )
    _runner(stack).step(run.run_id)
    with transaction(stack.engine) as conn:
        job_id = conn.execute(
            select(t.jobs.c.job_id).where(t.jobs.c.bulk_run_id == run.run_id)
        ).scalar_one()
    assert stack.queue.counts("bulk").ready == 1
    client = TestClient(create_app(stack))
    answer = client.delete(
        f"/v1/hypermedia/objects/{object_id}",
        headers={"Authorization": f"Bearer {person.api_key}"},
    )
    assert answer.status_code == 200, answer.text
    events = stack.dispatcher.events
    assert [e["status"] for _, e in events.history(job_id)] == ["cancelled"]
    assert 0 < events.client.ttl(events.key(job_id)) <= events.ended_ttl_seconds
    assert stack.queue.counts("bulk").ready == 0


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_a_page_made_while_one_of_its_objects_is_being_deleted_leaves_it_out(
    engine, settings, manual_clock
):
    """Before, on PostgreSQL: a run's page read its objects, and the delete of one of
    them looked for jobs on it before the page's jobs were committed: the delete was
    done and the run had a queued job, its credits reserved on the named account, on
    the deleted object whose blob was gone. Now the page's jobs lock their objects
    (FOR SHARE) and are made only on those still live: the page waits for the delete,
    leaves the deleted object out (skipped) and reserves for the others only. SQLite's
    writers take turns: the two never interleave (PostgreSQL only)."""
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    kept, deleted = _objects(stack, person, 2)  # 1 KB each: 101 mc a thumbnail
    payer, service, run = _paid_run(stack, person, 1.0)
    with ThreadPoolExecutor(1) as pool, stack.engine.connect() as conn:
        deleting = conn.begin()
        deletion = plan_deletion(conn, person.caller, deleted)  # no job on it yet
        stepped = pool.submit(_runner(stack).step, run.run_id)
        # The page either is done at once (it was, with a job on the object) or waits.
        while not stepped.done() and not support.waits_for_a_lock(stack.engine):
            time.sleep(0.01)
        mark_deleted(conn, deletion, manual_clock.now())
        deleting.commit()
        report = stepped.result()
    assert report.created == 1, report
    assert _jobs_per_object(stack.engine, run.run_id) == Counter({kept: 1})
    view = service.get(run.run_id)
    assert (view.created_jobs, view.skipped, view.scanned) == (1, 1, 2)
    with transaction(stack.engine) as conn:
        assert accounts.balance(conn, payer.caller.user_id).reserved_millicredits == 101
    assert stack.queue.counts("bulk").ready == 1


def test_a_version_deployed_mid_run_pauses_the_run(engine, settings, manual_clock):
    """thumbnail v2 deployed while a backfill of v1 is half way: the run's jobs would
    make v1's outputs, no longer the deployed version's. Before, the run went on making
    v1 jobs for every object left (and workers then failed 15 of 20 as profile_missing,
    the run 'completed'); now it pauses, naming why, and makes none."""
    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    _objects(stack, person, 20)
    service = _service(stack)
    run = service.create(
        RunSpec(kind="backfill", operation="thumbnail", max_in_flight=5, batch_size=5), "t"
    )
    runner = _runner(stack)
    runner.step(run.run_id)
    _finish(stack, "bulk", person.pool_id)
    profiles = dict(load_profiles(settings().profiles_path, settings().queue_names))
    bumped = profiles["thumbnail"].model_copy(
        update={"version": 2, "params": {**profiles["thumbnail"].params, "quality": 70}}
    )
    with transaction(stack.engine) as conn:
        sync_profiles(conn, {**profiles, "thumbnail": bumped}, stack.clock.now())
    assert runner.step(run.run_id).state == "paused"
    view = service.get(run.run_id)
    assert view.created_jobs == 5 and view.jobs == {"completed": 5}
    assert view.reason is not None and "version 1 is no longer active" in view.reason
    service.act(run.run_id, "resume")
    runner.step(run.run_id)
    assert service.get(run.run_id).state == "paused"  # still nothing made for v1
    assert service.get(run.run_id).created_jobs == 5


def test_the_cli_refuses_a_bad_value_naming_its_option(
    sqlite_engine, settings, manual_clock, tmp_path, redis_url, redis_prefix
):
    """What typer's own ranges do not cover (the spec's bounds: --max-in-flight up to
    1,000,000, --pool's 64 characters, --to-bucket's 3) is refused the same way, naming
    the option, never as an internal error."""
    from typer.testing import CliRunner

    from hypermedia.cli import app

    open_stack(settings, sqlite_engine, manual_clock).close()
    env = _cli_env(sqlite_engine, redis_url, redis_prefix, tmp_path)
    runner = CliRunner()
    for args, option, problem in [
        (["backfill", "thumbnail", "--max-in-flight", "1000001"], "--max-in-flight", "1000000"),
        (["regenerate", "thumbnail", "--pool", "p" * 65], "--pool", "at most 64"),
        (["migrate", "--to-bucket", "ab"], "--to-bucket", "at least 3"),
    ]:
        out = runner.invoke(app, ["bulk", *args], env=env)
        assert out.exit_code == 2, (args, out.output, out.exception)
        assert f"Invalid value for '{option}'" in out.output and problem in out.output, out.output
    with transaction(sqlite_engine) as conn:
        assert conn.execute(select(func.count()).select_from(t.bulk_runs)).scalar_one() == 0


def test_the_cli_throttles_a_run(
    sqlite_engine, settings, manual_clock, tmp_path, redis_url, redis_prefix
):
    """``hypermedia bulk throttle RUN --max-in-flight N``: the run's new cap, shown as
    ``status`` shows it; a bad value names the option, a finished run says its state."""
    from typer.testing import CliRunner

    from hypermedia.cli import app

    stack = open_stack(settings, sqlite_engine, manual_clock)
    try:
        run = _service(stack).create(RunSpec(kind="backfill", operation="thumbnail"), "t")
    finally:
        stack.close()
    env = _cli_env(sqlite_engine, redis_url, redis_prefix, tmp_path)
    runner = CliRunner()
    out = runner.invoke(
        app, ["bulk", "throttle", run.run_id, "--max-in-flight", "40", "--json"], env=env
    )
    assert out.exit_code == 0, (out.output, out.exception)
    assert json.loads(out.output)["max_in_flight"] == 40
    too_many = runner.invoke(
        app, ["bulk", "throttle", run.run_id, "--max-in-flight", "1000001"], env=env
    )
    assert too_many.exit_code == 2 and "Invalid value for '--max-in-flight'" in too_many.output
    assert runner.invoke(app, ["bulk", "cancel", run.run_id], env=env).exit_code == 0
    finished = runner.invoke(app, ["bulk", "throttle", run.run_id, "--max-in-flight", "5"], env=env)
    # main() prints it as "error: conflict: ..." (typer's app, invoked here, raises it)
    assert isinstance(finished.exception, Conflict), (finished.output, finished.exception)
    assert finished.exception.message == "cannot change a run that is cancelled"
    with transaction(sqlite_engine) as conn:
        assert runs.view(conn, run.run_id).max_in_flight == 40


def test_a_cancelled_run_says_how_many_jobs_are_still_stopping(
    engine, settings, manual_clock, tmp_path, redis_url, redis_prefix
):
    """Cancelling a run cancels its queued jobs and asks its running ones to stop; those
    run on until their worker sees it. The run said ``cancelled`` at once, everywhere an
    operator looks, and ``hypermedia status`` and the operator page dropped it: a
    cluster still busy with it passed for idle. Now each says how many still stop
    (``stopping``; "cancelled (2 jobs still stopping)"), until none is left."""
    from typer.testing import CliRunner

    from autoscaler import config as scheduler_config
    from autoscaler.page.routes import render, templates
    from autoscaler.status import gather
    from hypermedia.cli import app
    from hypermedia.ingest.api import create_app

    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    _objects(stack, person, 5)
    service = _service(stack)
    run = service.create(RunSpec(kind="backfill", operation="thumbnail", max_in_flight=10), "t")
    _runner(stack).step(run.run_id)
    running = stack.dispatcher.claim_and_start("bulk", "w-test", 2)
    assert len(running) == 2

    view = service.act(run.run_id, "cancel")
    assert view.jobs == {"cancelled": 3, "processing": 2}
    assert (view.state, view.stopping, view.to_json()["stopping"]) == ("cancelled", 2, 2)
    config = scheduler_config.load(None)
    (shown,) = gather(stack, config).bulk
    assert (shown.run_id, shown.counts["stopping"]) == (run.run_id, 2)
    assert shown.shown_state == "cancelled (2 jobs still stopping)"
    page = render(templates().get_template("operator.html"), stack, config, 1)
    assert "cancelled (2 jobs still stopping)" in page
    operator = add_user(stack, "ops-stopping", operator=True)
    client = TestClient(create_app(stack))
    answer = client.get(f"/v1/hypermedia/bulk/runs/{run.run_id}", headers=bearer(operator))
    assert answer.status_code == 200, answer.text
    assert (answer.json()["state"], answer.json()["stopping"]) == ("cancelled", 2)
    env = _cli_env(engine, redis_url, redis_prefix, tmp_path)
    out = CliRunner().invoke(app, ["bulk", "status", run.run_id], env=env)
    assert out.exit_code == 0, (out.output, out.exception)
    assert "  cancelled (2 jobs still stopping)" in out.output.splitlines()[0]

    # Their worker sees the request: one stops, then the other.
    assert stack.dispatcher.honour_cancel(running[0], "w-test")
    assert service.get(run.run_id).shown_state == "cancelled (1 job still stopping)"
    assert stack.dispatcher.honour_cancel(running[1], "w-test")
    done = service.get(run.run_id)
    assert (done.stopping, done.shown_state, done.to_json()["stopping"]) == (0, "cancelled", 0)
    assert gather(stack, config).bulk == []
    stack.close()


def test_a_filter_that_can_match_nothing_is_refused_naming_its_field(
    pg_engine, settings, manual_clock, tmp_path, redis_url, redis_prefix
):
    """A run whose filter names a pool or owner that does not exist, a kind the inspector
    never finds, or an empty time range matches nothing. Before, each was accepted (200),
    the run went to ``completed`` with 0 scanned and a dry run said 0 jobs: an operator's
    typo passed for a selection with nothing left to do. Now each is refused, nothing
    written, naming the field (the CLI: the option)."""
    from typer.testing import CliRunner

    from hypermedia.cli import app
    from hypermedia.ingest.api import create_app

    stack = open_stack(settings, pg_engine, manual_clock)
    person = make_user(stack)
    _objects(stack, person, 2)
    operator = add_user(stack, "root", operator=True)
    client = TestClient(create_app(stack))
    url = "/v1/hypermedia/bulk/runs"
    body = {"kind": "backfill", "operation": "thumbnail"}
    for flt, status, says in [
        ({"pool_id": "no-such-pool"}, 404, "filter.pool_id: no pool 'no-such-pool'"),
        ({"owner_id": "f" * 32}, 404, f"filter.owner_id: no user {'f' * 32!r}"),
        ({"detected_kind": "imgae"}, 422, "body.filter.detected_kind: Value error, 'imgae' is"),
        (
            {"created_after": "2026-02-01T00:00:00Z", "created_before": "2026-01-01T00:00:00Z"},
            422,
            "body.filter.created_before: Value error, the range is empty",
        ),
        (
            {"created_after": "2026-01-01T00:00:00Z", "created_before": "2026-01-01T00:00:00Z"},
            422,
            "body.filter.created_before: Value error, the range is empty",
        ),
        # pydantic read a number as Unix time: -1 was 1969 and selected nothing.
        (
            {"created_before": -1},
            422,
            "body.filter.created_before: Value error, -1 is not an ISO 8601 time",
        ),
        (
            {"created_after": "1700000000"},
            422,
            "body.filter.created_after: Value error, '1700000000' is not an ISO 8601 time",
        ),
    ]:
        for dry_run in (True, False):
            answer = client.post(
                url, json={**body, "filter": flt, "dry_run": dry_run}, headers=bearer(operator)
            )
            assert answer.status_code == status, (flt, answer.text)
            assert answer.json()["error"]["message"].startswith(says), (flt, answer.text)
    with transaction(stack.engine) as conn:
        assert conn.execute(select(func.count()).select_from(t.bulk_runs)).scalar_one() == 0
    # What does exist is taken: the pool, its owner, a kind, a range around now.
    ok = {
        "pool_id": person.pool_id,
        "owner_id": person.caller.user_id,
        "detected_kind": "image",
        "created_after": "2020-01-01T00:00:00Z",
    }
    answer = client.post(
        url, json={**body, "filter": ok, "dry_run": True}, headers=bearer(operator)
    )
    assert answer.status_code == 200, answer.text

    env = _cli_env(pg_engine, redis_url, redis_prefix, tmp_path)
    runner = CliRunner()
    out = runner.invoke(
        app,
        [
            "bulk",
            "backfill",
            "thumbnail",
            "--created-after",
            "2026-02-01",
            "--created-before",
            "2026-01-01",
        ],
        env=env,
    )
    assert out.exit_code == 2, (out.output, out.exception)
    assert "Invalid value for '--created-before'" in out.output, out.output
    out = runner.invoke(app, ["bulk", "backfill", "thumbnail", "--kind", "imgae"], env=env)
    assert out.exit_code == 2 and "Invalid value for '--kind'" in out.output, out.output
    out = runner.invoke(app, ["bulk", "backfill", "thumbnail", "--pool", "nopool"], env=env)
    assert isinstance(out.exception, NotFound), (out.output, out.exception)
    assert out.exception.message == "filter.pool_id: no pool 'nopool'"
    with transaction(stack.engine) as conn:
        assert conn.execute(select(func.count()).select_from(t.bulk_runs)).scalar_one() == 0
    stack.close()


def test_a_run_goes_only_on_a_queue_a_worker_serves(
    pg_engine, settings, tmp_path, redis_url, redis_prefix
):
    """The shipped scheduler.json (vps_only) gives the bulk queue no worker. The CLI
    then put a run on the operation's own queue at 10, but the API put it on ``bulk``
    all the same (200), and so did `--queue bulk`, on any head: accepted, its jobs
    created and never run. Now both place a run by one rule, on the head's queues
    (scheduler.json's and the live workers'): none named, ``bulk`` at 8 where a worker
    serves it, else the operation's own queue at 10; a queue named that no worker serves
    is 400 naming ``queue``, nothing written (dry run or not)."""
    from functools import partial

    from typer.testing import CliRunner

    from autoscaler import config as scheduler_config
    from autoscaler.head import staffed_queues
    from hypermedia.cli import app
    from hypermedia.clock import to_datetime
    from hypermedia.etc import shipped_etc
    from hypermedia.ingest.api import create_app
    from hypermedia.server import head_stack

    config = scheduler_config.load(shipped_etc() / "scheduler.json")
    served = partial(staffed_queues, config)
    open_stack(settings, pg_engine, None).close()  # the profiles synced, as `db upgrade` does
    stack = head_stack(settings(), served)  # what `hypermedia serve` runs
    person = make_user(stack)
    _objects(stack, person, 3)
    operator = add_user(stack, "root", operator=True)
    client = TestClient(create_app(stack))
    url = "/v1/hypermedia/bulk/runs"
    body = {"kind": "backfill", "operation": "thumbnail"}

    def post(**more: Any) -> Any:
        return client.post(url, json={**body, **more}, headers=bearer(operator))

    def count() -> int:
        with transaction(stack.engine) as conn:
            return int(conn.execute(select(func.count()).select_from(t.bulk_runs)).scalar_one())

    for dry_run in (True, False):
        refused = post(queue="bulk", dry_run=dry_run)
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["details"] == {"queue": "bulk"}, error
        assert error["message"].startswith("queue: no worker serves the 'bulk' queue"), error
    assert count() == 0
    placed = post()
    assert placed.status_code == 200, placed.text
    assert (placed.json()["queue"], placed.json()["priority"]) == ("images", 10)
    assert (post(dry_run=True).json()["queue"], post(priority=9).json()["priority"]) == (
        "images",
        9,
    )
    env = _cli_env(pg_engine, redis_url, redis_prefix, tmp_path)
    cli = CliRunner().invoke(app, ["bulk", "backfill", "thumbnail", "--queue", "bulk"], env=env)
    assert isinstance(cli.exception, InvalidRequest), (cli.output, cli.exception)
    assert "no worker serves the 'bulk' queue" in cli.exception.message
    assert count() == 2

    # A worker of the bulk queue joins: runs go there (read again after LIVE_SECONDS).
    now = to_datetime(time.time())
    with transaction(stack.engine) as conn:
        conn.execute(
            t.workers.insert().values(
                worker_id="w-bulk",
                queue="bulk",
                hostname="joined-node",
                status="active",
                concurrency=1,
                started_at=now,
                last_heartbeat=now,
            )
        )
    assert stack.served_queues is not None
    stack.served_queues._read_at -= stack.served_queues.LIVE_SECONDS  # type: ignore[attr-defined]
    joined = post()
    assert (joined.json()["queue"], joined.json()["priority"]) == ("bulk", 8), joined.text
    assert post(queue="bulk").status_code == 200
    cli = CliRunner().invoke(app, ["bulk", "backfill", "thumbnail", "--json"], env=env)
    assert cli.exit_code == 0, (cli.output, cli.exception)
    assert json.loads(cli.stdout)["queue"] == "bulk"
    stack.close()


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_a_retried_create_under_its_idempotency_key_starts_no_second_run(
    engine, settings, manual_clock, tmp_path, redis_url, redis_prefix
):
    """A web tier's POST /bulk/runs whose answer was lost (a timeout, a proxy's 502) and
    was sent again started a second run over the same objects: two runs listed, each
    taking its own max_in_flight of the queue, the second's counts all skips. Now an
    Idempotency-Key (the CLI's --idempotency-key) makes the retry answer the first run,
    also when both arrive at once; the key under another body is 409 naming the run;
    keys are the creator's own."""
    from typer.testing import CliRunner

    from hypermedia.cli import app
    from hypermedia.ingest.api import create_app

    stack = open_stack(settings, engine, manual_clock)
    person = make_user(stack)
    _objects(stack, person, 3)
    operator = add_user(stack, "root", operator=True)
    other = add_user(stack, "root2", operator=True)
    client = TestClient(create_app(stack))
    url = "/v1/hypermedia/bulk/runs"
    body = {"kind": "backfill", "operation": "thumbnail", "max_in_flight": 50}

    def post(who: Any, key: str, **more: Any) -> Any:
        return client.post(
            url, json={**body, **more}, headers={**bearer(who), "Idempotency-Key": key}
        )

    def count() -> int:
        with transaction(stack.engine) as conn:
            return int(conn.execute(select(func.count()).select_from(t.bulk_runs)).scalar_one())

    first = post(operator, "nightly-1")
    assert first.status_code == 200, first.text
    again = post(operator, "nightly-1")
    assert again.status_code == 200, again.text
    assert again.json()["run_id"] == first.json()["run_id"]
    assert count() == 1
    reused = post(operator, "nightly-1", max_in_flight=10)
    assert reused.status_code == 409, reused.text
    error = reused.json()["error"]
    assert error["code"] == "idempotency_key_reused"
    assert error["details"] == {"run_id": first.json()["run_id"]}
    theirs = post(other, "nightly-1")  # another operator's key
    assert theirs.status_code == 200 and theirs.json()["run_id"] != first.json()["run_id"]
    assert count() == 2
    responses = client.get("/openapi.json").json()["paths"][url]["post"]["responses"]
    assert "409" in responses

    # Both at once: one run, answered to both.
    service = _service(stack)
    spec = RunSpec(kind="backfill", operation="thumbnail", batch_size=7)
    with ThreadPoolExecutor(4) as pool:
        made = list(pool.map(lambda _: service.create(spec, "t", "same").run_id, range(4)))
    assert len(set(made)) == 1 and count() == 3

    env = _cli_env(stack.engine, redis_url, redis_prefix, tmp_path)
    runner = CliRunner()
    cli = ["bulk", "backfill", "thumbnail", "--json", "--idempotency-key", "cli-1"]
    ran = [runner.invoke(app, cli, env=env) for _ in range(2)]
    assert [r.exit_code for r in ran] == [0, 0], [(r.output, r.exception) for r in ran]
    assert json.loads(ran[0].stdout)["run_id"] == json.loads(ran[1].stdout)["run_id"]
    assert count() == 4
    bad = runner.invoke(app, [*cli[:-1], "caf\u00e9"], env=env)
    assert bad.exit_code == 2 and "Invalid value for '--idempotency-key'" in bad.output
    stack.close()


def test_a_bulk_run_is_always_created_by_someone(engine, settings, manual_clock):
    """An Idempotency-Key is unique per creator (``uk_bulk_run_idempotency_key``), and a
    NULL creator collides with none: runs created without one could share a key (two
    creates at once on PostgreSQL both insert), and a create under it then raised
    MultipleResultsFound (a 500). The API and the CLI always name theirs (``api:<user>``,
    ``cli:<user>``); now the service cannot be asked without one (mypy refuses it; so
    does the call)."""
    stack = open_stack(settings, engine, manual_clock)
    service = _service(stack)
    spec = RunSpec(kind="backfill", operation="thumbnail")
    with pytest.raises(TypeError):
        service.create(spec)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        service.create(spec, idempotency_key="same")  # type: ignore[call-arg]
    assert service.create(spec, "t", "same").run_id == service.create(spec, "t", "same").run_id
    stack.close()


def test_a_pass_with_nothing_to_write_takes_no_write_lock(sqlite_engine, settings, manual_clock):
    """The head's bulk pass runs every bulk_poll_seconds. It read the active runs, and
    each run's room and state, in write transactions: on SQLite each took the write
    lock (BEGIN IMMEDIATE), every API submit and worker completion beside it waiting its
    turn, 30 times a minute on an idle head and 3 more a run at its cap. Now what it only
    reads it reads in a snapshot, and takes the lock only to write."""
    stack = open_stack(settings, sqlite_engine, manual_clock)
    person = make_user(stack)
    _objects(stack, person, 10)
    runner = _runner(stack)
    with support.write_locks(stack.engine) as idle:
        assert runner.tick() == []
    assert idle == []

    service = _service(stack)
    run = service.create(
        RunSpec(kind="backfill", operation="thumbnail", max_in_flight=5, batch_size=5), "test"
    )
    runner.tick()
    assert service.get(run.run_id).created_jobs == 5
    with support.write_locks(stack.engine) as at_cap:
        (report,) = runner.tick()
    assert (report.created, report.state) == (0, "creating")
    assert at_cap == []

    _finish(stack, "bulk", person.pool_id)
    runner.tick()  # the last 5
    with support.write_locks(stack.engine) as exhausted:
        runner.tick()  # at its cap, nothing after its cursor: draining, 5 jobs live
    assert service.get(run.run_id).state == "draining"
    assert len(exhausted) == 1
    with support.write_locks(stack.engine) as draining:
        assert runner.tick()[0].state == "draining"
    assert draining == []
    # What it has to write it still writes, in one transaction.
    _finish(stack, "bulk", person.pool_id)
    with support.write_locks(stack.engine) as done:
        assert runner.tick()[0].state == "completed"
    assert len(done) == 1
