"""Credits of jobs: reserved at submit, released when a job ends unpaid, charged when
it completes. The one module that moves them (an operator's grant is
:func:`hypermedia.accounts.grant_credits`).

An account holds ``balance`` (what the user has) and ``reserved`` (held by unfinished
jobs); ``balance - reserved`` is what a submit may still reserve::

    reserve   submit                    reserved += reservation (refused past the balance)
    release   failed for good, cancelled reserved -= reservation
    charge    completed                 balance  -= actual, reserved -= reservation,
                                        one ``charge`` entry in the ledger per job
                                        (``uk_credit_ledger_job_charge``: a job found
                                        charged already is not charged again)

A job's reservation (``jobs.reserved_millicredits``) is its estimate plus the most the
units of work its step may report can cost (:meth:`~hypermedia.jobs.catalog.ProfileRecord.
reserve_millicredits`); its actual cost (the estimate plus the units it reported) is
charged at most that, so ``balance`` never goes below zero: what a submit reserves
never exceeds ``balance - reserved``.

:func:`reserve` and :func:`release` run on the caller's connection, inside the
transaction that creates or ends the job. The charge is part of the worker's group
commit: :func:`charge` and :func:`settle` build the statements that
:mod:`hypermedia.jobs.statements` runs (on PostgreSQL as parts of one statement with
the completion itself), from whatever source of completed jobs it hands in.

Amounts are integer millicredits. The account rows are the rows every submit and
completion of a user contends for: callers touch them last in a transaction, so the
job rows are locked first, in the same order everywhere.

What must hold, and :func:`drift` checks (``hypermedia credits check``): an account's
``balance`` is the sum of its ledger entries (grants, adjustments, charges), its
``reserved`` the sum of its unfinished jobs' reservations, neither below zero, and no
job has more than one charge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Insert,
    String,
    Update,
    bindparam,
    func,
    literal,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from hypermedia.clock import to_datetime
from hypermedia.db import tables as t
from hypermedia.errors import PaymentRequired
from hypermedia.jobs.states import TERMINAL

LEDGER_COLUMNS = ["user_id", "job_id", "kind", "amount_millicredits", "note", "created_at"]
# The predicate of uk_credit_ledger_job_charge, as written (ON CONFLICT infers the index
# from it).
CHARGES = text("kind = 'charge'")


def reserve(
    conn: Connection, user_id: str, amount: int, now: float, *, estimate: int | None = None
) -> None:
    """Hold ``amount`` of the user's available credits; :class:`PaymentRequired` (and
    nothing held) when fewer are available (``estimate``: the jobs' estimates, which
    its message shows beside ``amount`` when they differ)."""
    result = conn.execute(
        _RESERVE, {"r_user": user_id, "r_amount": amount, "r_now": to_datetime(now)}
    )
    if result.rowcount != 1:
        raise payment_required(conn, user_id, amount, estimate)


def reserving(user_id: Any, amount: Any, now: Any) -> Update:
    """The UPDATE that holds ``amount`` of the user's credits, touching no row when
    fewer are available (values or bound parameters)."""
    acct = t.credit_accounts
    return (
        update(acct)
        .where(
            acct.c.user_id == user_id,
            acct.c.balance_millicredits - acct.c.reserved_millicredits >= amount,
        )
        .values(reserved_millicredits=acct.c.reserved_millicredits + amount, updated_at=now)
    )


# Built once: every submit on SQLite runs it (PostgreSQL's submit is one statement of
# its own, :mod:`hypermedia.jobs.statements`). Built per call, its construction and
# cache key were ~10 % of the API server's CPU for a submit.
_RESERVE = reserving(
    bindparam("r_user", type_=t.credit_accounts.c.user_id.type),
    bindparam("r_amount", type_=t.credit_accounts.c.reserved_millicredits.type),
    bindparam("r_now", type_=t.credit_accounts.c.updated_at.type),
)


def payment_required(
    conn: Connection, user_id: str, amount: int, estimate: int | None = None
) -> PaymentRequired:
    """The error for a reservation of ``amount`` that found too few credits: how much
    it needs reserved and how much is available; with the jobs' ``estimate`` when the
    reservation is more (it holds the most their steps' units of work may cost too)."""
    acct = t.credit_accounts
    row = conn.execute(
        select(acct.c.balance_millicredits, acct.c.reserved_millicredits).where(
            acct.c.user_id == user_id
        )
    ).first()
    available = 0 if row is None else row.balance_millicredits - row.reserved_millicredits
    if estimate is None or estimate == amount:
        return PaymentRequired(
            f"not enough credits: this needs {amount / 1000:g} reserved,"
            f" {available / 1000:g} available",
            required_credits=amount / 1000,
            available_credits=available / 1000,
        )
    return PaymentRequired(
        f"not enough credits: this needs {amount / 1000:g} reserved (estimated"
        f" {estimate / 1000:g}, plus {(amount - estimate) / 1000:g} for the most its units"
        f" of work may cost), {available / 1000:g} available",
        required_credits=amount / 1000,
        available_credits=available / 1000,
        estimated_credits=estimate / 1000,
    )


def release(conn: Connection, user_id: str, amount: int, now: float) -> None:
    """Give back what a job that will never be charged held (failed for good, cancelled)."""
    acct = t.credit_accounts
    conn.execute(
        update(acct)
        .where(acct.c.user_id == user_id)
        .values(
            reserved_millicredits=acct.c.reserved_millicredits - amount,
            updated_at=to_datetime(now),
        )
    )


def charge(dialect: str, completed: Any, now: Any, *where: ColumnElement[bool]) -> Insert:
    """One ``charge`` ledger entry per completed job: ``-actual_millicredits``.

    ``completed``: the columns of the completed jobs (``user_id``, ``job_id``,
    ``actual_millicredits``): the job table's, filtered by ``where``, or a CTE's.
    ``now``: the moment, a bound parameter or a column. A job charged already (the
    ledger's unique ``uk_credit_ledger_job_charge``) gets no second entry, and no
    error: it is charged. RETURNING names the charges made (``job_id``, ``user_id``,
    ``amount_millicredits``): what the balance is to be spent by (:func:`settle`)."""
    rows = select(
        completed.user_id,
        completed.job_id,
        literal("charge", String),
        -completed.actual_millicredits,
        literal("job completed", String),
        now,
    ).where(*where)
    led = t.credit_ledger.c
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return (
        insert(t.credit_ledger)
        .from_select(LEDGER_COLUMNS, rows)
        .on_conflict_do_nothing(index_elements=[led.job_id], index_where=CHARGES)
        .returning(led.job_id, led.user_id, led.amount_millicredits)
    )


def settle(user_id: Any, charged: Any, reserved: Any, now: Any) -> Update:
    """A user's account after their completed jobs: ``charged`` (the sum of their actual
    costs) leaves the balance and ``reserved`` (the sum of their reservations) leaves the
    reservation. Each argument is a bound parameter or a column."""
    acct = t.credit_accounts
    return (
        update(acct)
        .where(acct.c.user_id == user_id)
        .values(
            balance_millicredits=acct.c.balance_millicredits - charged,
            reserved_millicredits=acct.c.reserved_millicredits - reserved,
            updated_at=now,
        )
    )


@dataclass(frozen=True, slots=True)
class AccountDrift:
    """An account whose row disagrees with what it should be: ``ledger`` (the sum of
    its ledger entries, what ``balance`` should be), ``held`` (the sum of its
    unfinished jobs' reservations, what ``reserved`` should be) and ``double_charged``
    (jobs with more than one charge)."""

    user_id: str
    balance: int
    ledger: int
    reserved: int
    held: int
    double_charged: tuple[str, ...] = ()

    @property
    def problems(self) -> list[str]:
        """What is wrong, in words (empty: nothing)."""
        found = []
        if self.balance != self.ledger:
            found.append(
                f"balance {self.balance / 1000:g} but its ledger sums to {self.ledger / 1000:g}"
            )
        if self.reserved != self.held:
            found.append(
                f"reserved {self.reserved / 1000:g}"
                f" but its unfinished jobs hold {self.held / 1000:g}"
            )
        if self.balance < 0:
            found.append(f"balance {self.balance / 1000:g} is below zero")
        if self.reserved < 0:
            found.append(f"reserved {self.reserved / 1000:g} is below zero")
        if self.double_charged:
            found.append(f"charged more than once: {', '.join(self.double_charged)}")
        return found


def drift(conn: Connection) -> list[AccountDrift]:
    """Every account whose row disagrees with its ledger and its jobs (see the module's
    docstring), by user id; empty when all agree. The accounts and their sums are one
    statement, so one snapshot: a submit or completion committing meanwhile is wholly
    in it or wholly out, never read as drift."""
    acct, led, j = t.credit_accounts.c, t.credit_ledger.c, t.jobs.c
    ledger = (
        select(func.coalesce(func.sum(led.amount_millicredits), 0))
        .where(led.user_id == acct.user_id)
        .scalar_subquery()
    )
    held = (
        select(func.coalesce(func.sum(j.reserved_millicredits), 0))
        .where(j.user_id == acct.user_id, j.status.not_in(sorted(s.value for s in TERMINAL)))
        .scalar_subquery()
    )
    rows = conn.execute(
        select(
            acct.user_id,
            acct.balance_millicredits,
            ledger.label("ledger"),
            acct.reserved_millicredits,
            held.label("held"),
        ).order_by(acct.user_id)
    ).all()
    twice: dict[str, list[str]] = {}
    for user_id, job_id in conn.execute(
        select(led.user_id, led.job_id)
        .where(led.kind == "charge", led.job_id.is_not(None))
        .group_by(led.user_id, led.job_id)
        .having(func.count() > 1)
        .order_by(led.user_id, led.job_id)
    ).all():
        twice.setdefault(user_id, []).append(job_id)
    checked = (
        AccountDrift(
            row.user_id,
            int(row.balance_millicredits),
            int(row.ledger),
            int(row.reserved_millicredits),
            int(row.held),
            tuple(twice.get(row.user_id, ())),
        )
        for row in rows
    )
    return [account for account in checked if account.problems]
