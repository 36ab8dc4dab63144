"""Concurrent claimers never get the same job: threads, processes, and the bare
guarded UPDATE raced head to head."""

from __future__ import annotations

import multiprocessing as mp
import threading
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import func, select

from hypermedia.config import load_settings
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.ingest.service import SubmitRequest
from hypermedia.jobs.repository import JobRepository
from hypermedia.stack import Stack
from tests.factories import make_object, make_user, open_stack


def _submit(stack, count):
    person = make_user(stack)
    obj = make_object(stack, person)
    requests = [SubmitRequest(object_id=obj, operations=["thumbnail"]) for _ in range(count)]
    return [r.job_ids[0] for r in stack.ingest.submit_many(person.caller, requests)]


def _drain(stack, worker_id, claimed, errors):
    try:
        while batch := stack.dispatcher.claim("images", worker_id, count=3):
            for job in batch:
                claimed.append(job.job_id)
                assert stack.dispatcher.start(job, worker_id)
                assert stack.dispatcher.complete(job, worker_id)
    except BaseException as exc:  # surfaced by the assertion below
        errors.append(exc)


def _assert_each_once(engine, job_ids, claimed):
    counts = Counter(claimed)
    assert set(counts) == set(job_ids)
    assert max(counts.values()) == 1
    with transaction(engine) as conn:
        statuses: dict[str, int] = dict(
            conn.execute(select(t.jobs.c.status, func.count()).group_by(t.jobs.c.status)).all()
        )
        attempts = conn.execute(select(func.count()).select_from(t.attempts)).scalar_one()
    assert statuses == {"completed": len(job_ids)}
    assert attempts == len(job_ids)


def test_threads_never_share_a_job(engine, settings):
    stack = open_stack(settings, engine, clock=None)
    job_ids = _submit(stack, 400)
    claimed: list[str] = []
    errors: list[BaseException] = []
    threads = [
        threading.Thread(target=_drain, args=(stack, f"w{i}", claimed, errors)) for i in range(8)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors
    _assert_each_once(stack.engine, job_ids, claimed)
    stack.close()


def _process_worker(settings_kwargs, worker_id, out_path):
    settings = load_settings(**settings_kwargs)
    stack = Stack.open(settings)
    claimed: list[str] = []
    errors: list[BaseException] = []
    _drain(stack, worker_id, claimed, errors)
    stack.close()
    Path(out_path).write_text("\n".join(claimed))
    if errors:
        raise errors[0]


@pytest.mark.parametrize("processes", [4])
def test_processes_never_share_a_job(pg_engine, settings, tmp_path, processes):
    cfg = settings()
    stack = Stack.open(cfg, engine=pg_engine, auto_migrate=True)
    job_ids = _submit(stack, 400)
    kwargs = {
        "database_url": cfg.database_url,
        "redis_url": cfg.redis_url,
        "redis_prefix": cfg.redis_prefix,
        "data_dir": str(tmp_path),
    }
    # Fresh processes, as spawn makes them (nothing of this one's connections), forked
    # from a server that imported this module once: spawn imported it in each of them.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    procs = [
        ctx.Process(target=_process_worker, args=(kwargs, f"p{i}", tmp_path / f"out{i}"))
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
    assert [p.exitcode for p in procs] == [0] * processes
    claimed = [
        line
        for i in range(processes)
        for line in (tmp_path / f"out{i}").read_text().splitlines()
        if line
    ]
    # More than one process did real work, or the test proves nothing about races.
    assert sum(1 for i in range(processes) if (tmp_path / f"out{i}").read_text()) > 1
    _assert_each_once(stack.engine, job_ids, claimed)
    stack.close()


def test_guarded_claim_has_exactly_one_winner(pg_engine, settings):
    """No Redis at all: 6 threads race the same UPDATE ... WHERE status='queued'."""
    stack = Stack.open(settings(), engine=pg_engine, auto_migrate=True)
    job_ids = _submit(stack, 60)
    repo = JobRepository()
    wins: list[tuple[str, str]] = []
    lock = threading.Lock()

    def racer(worker_id: str, barrier: threading.Barrier, job_id: str) -> None:
        barrier.wait()
        with transaction(pg_engine) as conn:
            claimed = repo.claim(conn, job_id, worker_id, stack.clock.now(), 60)
        if claimed is not None:
            with lock:
                wins.append((job_id, worker_id))

    for job_id in job_ids:
        barrier = threading.Barrier(6)
        racers = [threading.Thread(target=racer, args=(f"r{i}", barrier, job_id)) for i in range(6)]
        for th in racers:
            th.start()
        for th in racers:
            th.join(30)
    per_job = Counter(job_id for job_id, _ in wins)
    assert per_job == Counter(dict.fromkeys(job_ids, 1))
    with transaction(pg_engine) as conn:
        attempts = conn.execute(select(func.count()).select_from(t.attempts)).scalar_one()
    assert attempts == len(job_ids)
    stack.close()
