"""users.stored_bytes: each user's bytes of live objects, kept with every insert, resize
and deletion of their objects, so the storage quota reads one row instead of summing
the user's objects (a sum that grew with every object: 60 ms at 300,000)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04 00:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN (SQLite's too: a constant default), not a batch: SQLite's batch
    # copies the table, and with foreign keys on it cannot drop a users table that
    # objects and jobs refer to.
    op.add_column(
        "users",
        sa.Column("stored_bytes", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
    )
    op.execute(
        "UPDATE users SET stored_bytes = COALESCE((SELECT SUM(objects.size_bytes) FROM objects"
        " WHERE objects.owner_id = users.user_id AND objects.deleted_at IS NULL), 0)"
    )


def downgrade() -> None:
    op.drop_column("users", "stored_bytes")  # SQLite >= 3.35 drops a column in place
