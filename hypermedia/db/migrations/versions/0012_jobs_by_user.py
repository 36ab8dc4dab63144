"""ix_jobs_user_job on processing_jobs (user_id, job_id): GET /jobs pages a user's jobs
newest first by keyset (job_id < cursor), reading only the page's rows

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04 18:00:00.000000
"""

from __future__ import annotations

from hypermedia.db import online_ddl

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # On PostgreSQL built (and dropped) concurrently: a plain CREATE INDEX stopped every
    # submit, claim and completion for the whole build (see online_ddl). On SQLite the
    # same statement as the batch it was made in (an index needs no copy there).
    online_ddl.create_index("ix_jobs_user_job", "processing_jobs", ["user_id", "job_id"])


def downgrade() -> None:
    online_ddl.drop_index("ix_jobs_user_job", "processing_jobs")
