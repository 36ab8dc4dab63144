"""processing_jobs: fewer index entries per claim and completion. A claim or a
completion rewrites the job's row (status is indexed: never a HOT update), and the new
row version gets an entry in every index whose predicate it meets: the bulk run indexes
become partial (bulk jobs only), completed_at's too (ended jobs only), and user_id's own
index goes ((user_id, job_id) serves it). 12 index entries per claim -> 8, per completion
-> 9. Rebuilding the indexes holds writes to processing_jobs for the time it takes.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04 00:30:00.000000
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

TABLE = "processing_jobs"
BULK = sa.text("bulk_run_id IS NOT NULL")
ENDED = sa.text("completed_at IS NOT NULL")


def _where(predicate: sa.TextClause | None) -> dict[str, Any]:
    return {"postgresql_where": predicate, "sqlite_where": predicate}


def _rebuild(partial: bool) -> None:
    bulk, ended = (BULK, ENDED) if partial else (None, None)
    for name in (
        "uk_jobs_bulk_run_object",
        "ix_jobs_bulk_run_status",
        "ix_processing_jobs_completed_at",
    ):
        op.drop_index(name, table_name=TABLE)
    op.create_index(
        "uk_jobs_bulk_run_object", TABLE, ["bulk_run_id", "object_id"], unique=True, **_where(bulk)
    )
    op.create_index("ix_jobs_bulk_run_status", TABLE, ["bulk_run_id", "status"], **_where(bulk))
    op.create_index("ix_processing_jobs_completed_at", TABLE, ["completed_at"], **_where(ended))


def upgrade() -> None:
    op.drop_index("ix_processing_jobs_user_id", table_name=TABLE)
    _rebuild(partial=True)


def downgrade() -> None:
    _rebuild(partial=False)
    op.create_index("ix_processing_jobs_user_id", TABLE, ["user_id"])
