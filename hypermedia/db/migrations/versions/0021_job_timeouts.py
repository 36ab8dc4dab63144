"""processing_jobs.timeout_seconds: a job's own time limit, worked out at submit from
the pages its step may read (``timeout_seconds`` + ``timeout_seconds_per_page`` x pages,
at most ``max_timeout_seconds``: processing_profiles' two new columns), so that a long
scanned document is read in the time it needs instead of being refused at 25 pages.
The worker gives it to the job's child (CPU rlimit, wall clock) and to its lease. NULL,
every job from before: its profile's timeout_seconds, as before (no row is rewritten).

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-08 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain nullable ADD COLUMNs (no batch: SQLite's copies the table, which other
    # tables refer to).
    op.add_column("processing_profiles", sa.Column("timeout_seconds_per_page", sa.Float()))
    op.add_column("processing_profiles", sa.Column("max_timeout_seconds", sa.Integer()))
    op.add_column("processing_jobs", sa.Column("timeout_seconds", sa.Integer()))


def downgrade() -> None:
    op.drop_column("processing_jobs", "timeout_seconds")  # SQLite >= 3.35: in place
    op.drop_column("processing_profiles", "max_timeout_seconds")
    op.drop_column("processing_profiles", "timeout_seconds_per_page")
