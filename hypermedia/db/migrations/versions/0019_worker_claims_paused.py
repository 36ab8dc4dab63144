"""workers.claims_paused_since and claims_paused_reason: a worker that claims no job
although it is active (its workdirs' disk below ``worker_min_free_disk_mb``) says so in
its row, since when and why ("low disk: 312 MB free, needs 1024"), for ``hypermedia
status``, the alert rule ``worker_disk_low`` and the scheduler, which drains a cloud
worker paused past ``scaling_rules.scale_down.claims_paused_drain_seconds``. NULL: claiming.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import hypermedia.db.models

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain nullable ADD COLUMNs (no batch: SQLite's copies the table, which
    # worker_metrics refers to).
    op.add_column(
        "workers",
        sa.Column("claims_paused_since", hypermedia.db.models.UTCDateTime(), nullable=True),
    )
    op.add_column("workers", sa.Column("claims_paused_reason", sa.String(200), nullable=True))


def downgrade() -> None:
    op.drop_column("workers", "claims_paused_reason")  # SQLite >= 3.35: in place
    op.drop_column("workers", "claims_paused_since")
