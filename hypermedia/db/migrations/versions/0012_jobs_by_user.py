"""ix_jobs_user_job on processing_jobs (user_id, job_id): GET /jobs pages a user's jobs
newest first by keyset (job_id < cursor), reading only the page's rows

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04 18:00:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("processing_jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_user_job", ["user_id", "job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("processing_jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_user_job")
