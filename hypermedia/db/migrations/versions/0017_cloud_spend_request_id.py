"""cloud_spend.request_id: the launch's request id (the ``hypermedia-request`` tag), kept
after the row takes the instance's id, so a cloud bill that names the tag and not the
instance (Cost Explorer's cost allocation tags, a billing export's labels) finds its row.
A running instance's row gets its request id at the next listing (from the instance's
tags); the ended rows from before have none and their instances cannot be found in such
a bill: they are marked reconciled as they are (billed unknown), so the first
reconciliation does not report each of them as billed nothing. Days are still compared.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("cloud_spend", sa.Column("request_id", sa.String(64), nullable=True))
    op.execute(
        "UPDATE cloud_spend SET reconciled_at = terminated_at"
        " WHERE terminated_at IS NOT NULL AND reconciled_at IS NULL"
    )


def downgrade() -> None:
    op.drop_column("cloud_spend", "request_id")  # SQLite >= 3.35 drops a column in place
