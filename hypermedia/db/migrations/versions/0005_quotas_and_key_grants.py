"""objects.deleted_at (DELETE /objects/{id}: storage quotas count live objects only) and
api_keys.priority_min / priority_max / submits_per_minute (what the operator granted a key)

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 20:15:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import hypermedia.db.models

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("objects", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("deleted_at", hypermedia.db.models.UTCDateTime(), nullable=True)
        )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("priority_min", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("priority_max", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("submits_per_minute", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_column("submits_per_minute")
        batch_op.drop_column("priority_max")
        batch_op.drop_column("priority_min")
    with op.batch_alter_table("objects", schema=None) as batch_op:
        batch_op.drop_column("deleted_at")
