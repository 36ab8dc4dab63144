"""objects.idempotency_key: the ``Idempotency-Key`` of the upload that made an object
(``PUT /objects``), unique per owner (``uk_object_idempotency_key``; rows without one,
every object from before, never collide), so that a retried upload whose answer was
lost is answered with the first object instead of storing a second one and counting
its bytes twice against the quota.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from hypermedia.db import online_ddl

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN and a unique index, not a batch (SQLite's batch copies the
    # table, which other tables refer to); a unique index rather than a constraint:
    # SQLite adds the one in place, not the other.
    # On PostgreSQL the index is built concurrently (objects is the biggest table, and
    # written by every upload), after the column is committed: the column may be there
    # already when the migration is run again.
    postgres = op.get_bind().dialect.name == "postgresql"
    op.add_column(
        "objects",
        sa.Column("idempotency_key", sa.String(200), nullable=True),
        if_not_exists=True if postgres else None,
    )
    online_ddl.create_index(
        "uk_object_idempotency_key", "objects", ["owner_id", "idempotency_key"], unique=True
    )


def downgrade() -> None:
    # Not dropped concurrently (as 0026's index is): DROP COLUMN takes an ACCESS
    # EXCLUSIVE lock on objects anyway (and drops the index with it), and an index
    # dropped in a transaction of its own would be gone while the column stays if the
    # column's drop then gave up on its lock: uploads under a key no longer unique.
    op.drop_index("uk_object_idempotency_key", table_name="objects")
    op.drop_column("objects", "idempotency_key")  # SQLite >= 3.35 drops a column in place
