"""credit_ledger: one ``charge`` entry per job, a rule of the database
(``uk_credit_ledger_job_charge``, a unique index on ``job_id`` over the charge entries;
grants and adjustments, which name no job, are not in it). Until now only the job
state machine (a job completes once) and ``hypermedia credits check`` kept it; a
completion that finds its job charged already now charges nothing more
(:func:`hypermedia.jobs.credits.charge`: ON CONFLICT DO NOTHING).

A ledger that holds a job charged twice already is refused, naming the jobs and their
entries, and nothing is changed (the check comes before the index, which PostgreSQL
builds concurrently: a duplicate written between the two, which no code writes, fails
the build and leaves an INVALID index, dropped and built again by the next upgrade,
whose check names it): which of the entries stand, and whether the balance
was spent twice, is the operator's to decide (``hypermedia credits check`` compares each
account's balance with its ledger), before upgrading again.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-11 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from hypermedia.db import online_ddl

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None

INDEX = "uk_credit_ledger_job_charge"
CHARGES = "kind = 'charge'"
_SHOWN = 20


def _charged_twice(conn: sa.Connection) -> dict[str, list[int]]:
    """The jobs with more than one charge entry: job id -> their entry ids."""
    ledger = sa.table("credit_ledger", *map(sa.column, ("entry_id", "job_id", "kind")))
    c = ledger.c
    twice = (
        sa.select(c.job_id)
        .where(c.kind == "charge", c.job_id.is_not(None))
        .group_by(c.job_id)
        .having(sa.func.count() > 1)
    )
    found: dict[str, list[int]] = {}
    for job_id, entry_id in conn.execute(
        sa.select(c.job_id, c.entry_id)
        .where(c.kind == "charge", c.job_id.in_(twice))
        .order_by(c.job_id, c.entry_id)
    ).all():
        found.setdefault(job_id, []).append(int(entry_id))
    return found


def upgrade() -> None:
    from hypermedia.errors import HypermediaError

    twice = _charged_twice(op.get_bind())
    if twice:
        shown = "; ".join(
            f"{job_id}: entries {', '.join(map(str, entries))}"
            for job_id, entries in list(twice.items())[:_SHOWN]
        )
        more = f" and {len(twice) - _SHOWN} more" if len(twice) > _SHOWN else ""
        raise HypermediaError(
            f"cannot make one charge per job a rule of credit_ledger (0030): {len(twice)}"
            f" job(s) are charged more than once already ({shown}{more}); 0030 made no"
            " change (on PostgreSQL the migrations before it in this upgrade are"
            " applied: each commits alone). Keep one charge entry of each job (delete"
            " the others), give back what a balance was charged twice (`hypermedia"
            " credits check` names each account whose balance disagrees with its"
            " ledger), and upgrade again",
            job_ids=list(twice),
        )
    # On PostgreSQL built concurrently (online_ddl): a plain CREATE INDEX would stop
    # every completion's charge for the whole build (one entry per completed job).
    online_ddl.create_index(INDEX, "credit_ledger", ["job_id"], unique=True, where=CHARGES)


def downgrade() -> None:
    # On PostgreSQL dropped concurrently: a plain DROP INDEX takes an ACCESS EXCLUSIVE
    # lock on credit_ledger, which waits behind a charge in flight with every charge,
    # grant and read of the ledger queued behind it (see online_ddl).
    online_ddl.drop_index(INDEX, "credit_ledger")
