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

from hypermedia.db import online_ddl

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


# Each user's bytes of live objects.
STORED = (
    "COALESCE((SELECT SUM(objects.size_bytes) FROM objects"
    " WHERE objects.owner_id = users.user_id AND objects.deleted_at IS NULL), 0)"
)


def upgrade() -> None:
    # A plain ADD COLUMN (SQLite's too: a constant default), not a batch: SQLite's batch
    # copies the table, and with foreign keys on it cannot drop a users table that
    # objects and jobs refer to.
    column = sa.Column("stored_bytes", sa.BigInteger(), server_default=sa.text("0"), nullable=False)
    if op.get_bind().dialect.name != "postgresql":
        op.add_column("users", column)
        op.execute(f"UPDATE users SET stored_bytes = {STORED}")  # noqa: S608 - constant SQL
        return
    # On PostgreSQL the column (a constant default: no rewrite since PostgreSQL 11, a
    # moment) is committed first and the users are filled in batches, each holding
    # only its rows (online_ddl.update_in_batches): in the column's transaction the
    # fill, a sum of every live object, ran under its ACCESS EXCLUSIVE lock on users,
    # and every request's authentication, upload and submit (their foreign keys lock
    # the user's row) waited for it. The column may be there already when the
    # migration is run again (it was committed before the fill).
    op.add_column("users", column, if_not_exists=True)
    online_ddl.update_in_batches("users", "user_id", f"stored_bytes = {STORED}", rows=500)


def downgrade() -> None:
    op.drop_column("users", "stored_bytes")  # SQLite >= 3.35 drops a column in place
