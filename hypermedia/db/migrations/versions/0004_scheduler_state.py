"""scheduler_state: the cost lock and the scheduler's history, by name

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29 21:50:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import hypermedia.db.models

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "scheduler_state",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.JSON(), nullable=False),
        sa.Column("updated_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_scheduler_state")),
    )


def downgrade() -> None:
    op.drop_table("scheduler_state")
