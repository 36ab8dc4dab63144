"""workers.outage_paused_since, outage_paused_reason and outage_paused_seconds: a
worker's last outage pause (PostgreSQL, Redis or the storage down: it claimed no job
meanwhile, so that none spent an attempt on the outage), since when, why ("the record
is unavailable: ...") and, once it ended, how long it lasted (NULL while it lasts).
The worker keeps it in memory and writes it as soon as the row can be written again:
``hypermedia status`` and the operator page show it. NULL: never paused.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-08 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import hypermedia.db.models

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain nullable ADD COLUMNs (no batch: SQLite's copies the table, which
    # worker_metrics refers to).
    op.add_column(
        "workers",
        sa.Column("outage_paused_since", hypermedia.db.models.UTCDateTime(), nullable=True),
    )
    op.add_column("workers", sa.Column("outage_paused_reason", sa.String(200), nullable=True))
    op.add_column("workers", sa.Column("outage_paused_seconds", sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column("workers", "outage_paused_seconds")  # SQLite >= 3.35: in place
    op.drop_column("workers", "outage_paused_reason")
    op.drop_column("workers", "outage_paused_since")
