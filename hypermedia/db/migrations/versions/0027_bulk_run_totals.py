"""bulk_runs.total: how many objects a run's filter selected when it was created (one
count, at create), so that its progress has a whole to be a share of (done, failed,
remaining, a percentage, an ETA). Runs from before have none: their progress says no
total until nothing is left to scan.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-09 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("bulk_runs", sa.Column("total", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("bulk_runs", "total")
