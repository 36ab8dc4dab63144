"""job_checkpoints: the stored pieces of long jobs (transcode chunks) a retry goes on
from, each written at its grant and committed once stored

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02 19:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import hypermedia.db.models

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_checkpoints",
        sa.Column("storage_key", sa.String(length=512), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("granted_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.Column("committed_at", hypermedia.db.models.UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["processing_jobs.job_id"],
            name=op.f("fk_job_checkpoints_job_id_processing_jobs"),
        ),
        sa.PrimaryKeyConstraint("storage_key", name=op.f("pk_job_checkpoints")),
    )
    with op.batch_alter_table("job_checkpoints", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_checkpoints_job_id"), ["job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job_checkpoints", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_checkpoints_job_id"))
    op.drop_table("job_checkpoints")
