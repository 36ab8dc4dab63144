"""queue_samples: each queue's depth, oldest age and workers as the scheduler's leader
saw them, at most once a minute, kept two days (the operator page's charts)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import hypermedia.db.models

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "queue_samples",
        sa.Column(
            "sample_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("sampled_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.Column("queue", sa.String(length=32), nullable=False),
        sa.Column("depth", sa.Integer(), nullable=False),
        sa.Column("oldest_age_seconds", sa.Float(), nullable=False),
        sa.Column("workers", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("sample_id", name=op.f("pk_queue_samples")),
    )
    with op.batch_alter_table("queue_samples", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_queue_samples_sampled_at"), ["sampled_at"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("queue_samples", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_queue_samples_sampled_at"))
    op.drop_table("queue_samples")
