"""blob_deletions: the stored blobs a deleted object left to delete, written in the
transaction that marks the object deleted and removed once the storage has deleted
the blob; one the storage failed is tried again by the head's maintenance, with
backoff (``next_attempt_at``), so a blob is never left behind for good.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-09 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import hypermedia.db.models

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "blob_deletions",
        sa.Column("storage_key", sa.String(length=512), nullable=False),
        sa.Column("object_id", sa.String(length=32), nullable=True),
        sa.Column("requested_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.Column("last_error", sa.String(length=200), nullable=True),
        sa.PrimaryKeyConstraint("storage_key", name=op.f("pk_blob_deletions")),
    )
    with op.batch_alter_table("blob_deletions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_blob_deletions_next_attempt_at"), ["next_attempt_at"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("blob_deletions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_blob_deletions_next_attempt_at"))
    op.drop_table("blob_deletions")
