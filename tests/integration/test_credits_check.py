"""``hypermedia credits check``: each credit account against its ledger and its jobs."""

from __future__ import annotations

import json
import logging

import pytest
from sqlalchemy import insert, select, text, update
from sqlalchemy.exc import IntegrityError
from typer.testing import CliRunner

from hypermedia.cli import app
from hypermedia.clock import to_datetime
from hypermedia.db import tables as t
from hypermedia.db.engine import snapshot, transaction
from hypermedia.jobs.credits import AccountDrift, drift
from tests import support
from tests.factories import make_user, open_stack, submit


def _check(engine, redis_url: str, redis_prefix: str, data_dir, *args: str) -> tuple[int, str]:
    env = {
        "HYPERMEDIA_DATABASE_URL": support.url_string(engine),
        "HYPERMEDIA_REDIS_URL": redis_url,
        "HYPERMEDIA_REDIS_PREFIX": redis_prefix,
        "HYPERMEDIA_DATA_DIR": str(data_dir),
    }
    out = CliRunner().invoke(app, ["credits", "check", *args], env=env)
    return out.exit_code, out.stdout


def test_the_check_finds_accounts_that_disagree_with_their_ledger_and_jobs(
    engine, settings, manual_clock, redis_url, redis_prefix, tmp_path
):
    """After submits, a completion, a cancel and a failure every account agrees; an
    account row moved by hand, a job's charge written twice, are each named."""
    stack = open_stack(settings, engine, manual_clock)
    alice, bob = make_user(stack, credits=10), make_user(stack, credits=1)
    for _ in range(4):
        submit(stack, alice, ["thumbnail"])
    submit(stack, bob, ["thumbnail"])
    done, failed, running = stack.dispatcher.claim("images", "w", count=3)
    for job in (done, failed, running):
        stack.dispatcher.start(job, "w")
    assert stack.dispatcher.complete(done, "w", actual_millicredits=50)
    stack.dispatcher.fail(failed, "w", "invalid_input", "bad", retryable=False)
    (cancelled,) = submit(stack, alice, ["thumbnail"])
    stack.ingest.cancel(alice.caller, cancelled)
    with snapshot(stack.engine) as conn:
        assert drift(conn) == []
    assert _check(stack.engine, redis_url, redis_prefix, tmp_path, "--json") == (0, "[]\n")
    assert _check(stack.engine, redis_url, redis_prefix, tmp_path) == (
        0,
        "every credit account agrees with its ledger and its jobs\n",
    )

    a, c = t.credit_accounts.c, t.credit_ledger.c
    with transaction(stack.engine) as conn:
        conn.execute(
            update(t.credit_accounts)
            .where(a.user_id == alice.caller.user_id)
            .values(balance_millicredits=a.balance_millicredits + 5)
        )
        conn.execute(
            update(t.credit_accounts)
            .where(a.user_id == bob.caller.user_id)
            .values(reserved_millicredits=-1)
        )
        charge = conn.execute(select(t.credit_ledger).where(c.kind == "charge")).one()
        twice = {k: v for k, v in charge._mapping.items() if k != "entry_id"}
        # The ledger refuses a second charge of a job (0030); a record from before it,
        # or whose index was dropped by hand, may still hold one.
        with pytest.raises(IntegrityError), conn.begin_nested():
            conn.execute(insert(t.credit_ledger).values(**twice))
        conn.execute(text("DROP INDEX uk_credit_ledger_job_charge"))
        conn.execute(insert(t.credit_ledger).values(**twice))
    with snapshot(stack.engine) as conn:
        found = drift(conn)
    by_user = {d.user_id: d for d in found}
    assert by_user[alice.caller.user_id] == AccountDrift(
        alice.caller.user_id, 10_000 - 50 + 5, 10_000 - 100, 2 * 101, 2 * 101, (done.job_id,)
    )
    assert by_user[alice.caller.user_id].problems == [
        "balance 9.955 but its ledger sums to 9.9",
        f"charged more than once: {done.job_id}",
    ]
    assert by_user[bob.caller.user_id].problems == [
        "reserved -0.001 but its unfinished jobs hold 0.101",
        "reserved -0.001 is below zero",
    ]
    code, out = _check(stack.engine, redis_url, redis_prefix, tmp_path)
    assert code == 1
    assert f"({bob.caller.user_id}): reserved -0.001 but its unfinished jobs hold 0.101;" in out
    code, out = _check(stack.engine, redis_url, redis_prefix, tmp_path, "--json")
    assert code == 1
    shown = {d["user_id"]: d for d in json.loads(out)}
    assert set(shown) == {alice.caller.user_id, bob.caller.user_id}
    assert shown[bob.caller.user_id]["held_millicredits"] == 101
    stack.close()


def test_a_completion_of_a_job_charged_already_charges_it_no_more(
    engine, settings, manual_clock, caplog
):
    """The ledger had no rule of one charge per job (only the state machine, and this
    check after the fact): a job completed when a charge of it stood already (its
    record moved back by hand, a bug) was charged again, its user's balance spent
    twice. Now the ledger's unique index (0030) keeps one charge per job, and the
    completion takes a job charged already as charged: it completes (no error, no
    500), its reservation released, nothing more spent, a warning logged."""
    stack = open_stack(settings, engine, manual_clock)
    alice = make_user(stack, credits=10)
    submit(stack, alice, ["thumbnail"])
    submit(stack, alice, ["thumbnail"])
    charged, fresh = stack.dispatcher.claim("images", "w", count=2)
    for job in (charged, fresh):
        assert stack.dispatcher.start(job, "w")
    a = t.credit_accounts.c
    with transaction(stack.engine) as conn:  # its charge, as a completion would make it
        conn.execute(
            insert(t.credit_ledger).values(
                user_id=alice.caller.user_id,
                job_id=charged.job_id,
                kind="charge",
                amount_millicredits=-50,
                note="job completed",
                created_at=to_datetime(manual_clock.now()),
            )
        )
        conn.execute(
            update(t.credit_accounts)
            .where(a.user_id == alice.caller.user_id)
            .values(balance_millicredits=a.balance_millicredits - 50)
        )
    with caplog.at_level(logging.WARNING, logger="hypermedia.jobs.repository"):
        assert stack.dispatcher.complete(charged, "w", actual_millicredits=50)
        assert stack.dispatcher.complete(fresh, "w", actual_millicredits=70)
    c = t.credit_ledger.c
    with snapshot(stack.engine) as conn:
        charges = conn.execute(
            select(c.job_id, c.amount_millicredits).where(c.kind == "charge").order_by(c.entry_id)
        ).all()
        assert [tuple(r) for r in charges] == [(charged.job_id, -50), (fresh.job_id, -70)]
        account = conn.execute(
            select(a.balance_millicredits, a.reserved_millicredits).where(
                a.user_id == alice.caller.user_id
            )
        ).one()
        assert tuple(account) == (10_000 - 50 - 70, 0)
        assert drift(conn) == []
    for job in (charged, fresh):
        assert stack.ingest.get_job(alice.caller, job.job_id).status == "completed"
    assert f"job {charged.job_id} completed but charged already" in caplog.text
    stack.close()
