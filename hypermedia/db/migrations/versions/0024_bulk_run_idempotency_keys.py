"""bulk_runs.idempotency_key and request_hash: the ``Idempotency-Key`` of the request that
created a run (``POST /bulk/runs``, ``hypermedia bulk ... --idempotency-key``) and a hash
of what it asked, unique per creator (``uk_bulk_run_idempotency_key``; rows without one,
every run from before, never collide), so that a retried create whose answer was lost is
answered with the first run instead of starting a second one over the same objects.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-09 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # As 0020: plain ADD COLUMNs and a unique index (SQLite adds both in place).
    op.add_column("bulk_runs", sa.Column("idempotency_key", sa.String(200), nullable=True))
    op.add_column("bulk_runs", sa.Column("request_hash", sa.String(64), nullable=True))
    op.create_index(
        "uk_bulk_run_idempotency_key",
        "bulk_runs",
        ["created_by", "idempotency_key"],
        unique=True,
    )


def downgrade() -> None:
    op.drop_index("uk_bulk_run_idempotency_key", table_name="bulk_runs")
    op.drop_column("bulk_runs", "request_hash")
    op.drop_column("bulk_runs", "idempotency_key")
