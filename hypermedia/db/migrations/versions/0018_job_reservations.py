"""processing_jobs.reserved_millicredits: what a job's submit held on its user's credits,
the estimate plus the most the units of work its step may report can cost (the ocr
step's escalations, which were charged on top of a reservation of the estimate alone,
so a balance could go below zero). Every release gives it back, and a completion
charges at most it. A job from before that has not ended reserved its estimate: its
row gets that. An ended job holds nothing (its reservation was given back when it
ended, and nothing reads the column of one again): it keeps the 0 of the ADD COLUMN,
so the migration rewrites only the live jobs' rows, never the whole table (rewriting
every row held every write to processing_jobs for 5.5 s at 200,000 jobs).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from hypermedia.db import online_ddl

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


# The jobs that have not ended (as SQLite's UPDATE says).
LIVE = "status IN ('created', 'queued', 'claimed', 'processing', 'retry_wait')"


def upgrade() -> None:
    # A plain ADD COLUMN, not a batch (SQLite's batch copies the table, which other
    # tables refer to): SQLite needs a constant default for a NOT NULL column, so it
    # keeps DEFAULT 0 (every insert gives the column); PostgreSQL drops it.
    column = sa.Column(
        "reserved_millicredits", sa.BigInteger(), server_default=sa.text("0"), nullable=False
    )
    if op.get_bind().dialect.name != "postgresql":
        op.add_column("processing_jobs", column)
        op.execute(
            "UPDATE processing_jobs SET reserved_millicredits = estimated_millicredits"
            " WHERE status IN ('created', 'queued', 'claimed', 'processing', 'retry_wait')"
        )
        return
    # On PostgreSQL the column (a constant default: no rewrite since PostgreSQL 11) and
    # the default's drop are a moment's transaction, committed before the live jobs are
    # filled in batches, each holding only its rows (online_ddl.update_in_batches): in
    # the column's transaction the fill ran under its ACCESS EXCLUSIVE lock on
    # processing_jobs, and every submit, claim and completion (and read of a job)
    # waited for it. The default goes first, as it went when the fill's transaction
    # committed: a job a process still on the code from before inserts gives no
    # reservation (its submit reserved the estimate) and is refused, never kept at 0.
    # The column may be there already when the migration is run again.
    op.add_column("processing_jobs", column, if_not_exists=True)
    op.alter_column("processing_jobs", "reserved_millicredits", server_default=None)
    online_ddl.update_in_batches(
        "processing_jobs",
        "job_id",
        "reserved_millicredits = estimated_millicredits",
        where=LIVE,
        rows=2000,
    )


def downgrade() -> None:
    op.drop_column("processing_jobs", "reserved_millicredits")  # SQLite >= 3.35: in place
