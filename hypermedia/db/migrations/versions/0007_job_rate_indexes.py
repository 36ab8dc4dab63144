"""processing_jobs.created_at and completed_at indexed: the jobs in and out of each queue
over the last minutes (``hypermedia status``) without reading every job

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 12:00:00.000000
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("processing_jobs", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_processing_jobs_created_at"), ["created_at"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_processing_jobs_completed_at"), ["completed_at"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("processing_jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_processing_jobs_completed_at"))
        batch_op.drop_index(batch_op.f("ix_processing_jobs_created_at"))
