"""processing_jobs.created_at and completed_at indexed: the jobs in and out of each queue
over the last minutes (``hypermedia status``) without reading every job

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 12:00:00.000000
"""

from __future__ import annotations

from hypermedia.db import online_ddl

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # On PostgreSQL built (and dropped) concurrently: a plain CREATE INDEX stopped every
    # submit, claim and completion for the whole build (see online_ddl). On SQLite the
    # same statements as the batch these were made in (an index needs no copy there).
    online_ddl.create_index("ix_processing_jobs_created_at", "processing_jobs", ["created_at"])
    online_ddl.create_index("ix_processing_jobs_completed_at", "processing_jobs", ["completed_at"])


def downgrade() -> None:
    online_ddl.drop_index("ix_processing_jobs_completed_at", "processing_jobs")
    online_ddl.drop_index("ix_processing_jobs_created_at", "processing_jobs")
