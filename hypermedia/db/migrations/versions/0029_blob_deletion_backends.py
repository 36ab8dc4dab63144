"""blob_deletions.storage_backend: where a deleted object's verified copy was migrated
to (its objects.storage_backend when the deletion was recorded; NULL: the server's
storage only). The deleter deletes the key there too, not only in the server's storage
(a migration leaves the original there). The copies of objects deleted before it were
left there: each is recorded now (due at once), so the sweep deletes it.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-11 10:00:00.000000
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    column = sa.Column("storage_backend", sa.String(length=64), nullable=True)
    if op.get_bind().dialect.name != "postgresql":
        with op.batch_alter_table("blob_deletions", schema=None) as batch_op:
            batch_op.add_column(column)
        op.execute(_copies_left())
        return
    # On PostgreSQL the column (ACCESS EXCLUSIVE on blob_deletions, a moment: nullable,
    # no default) is committed before the scan of objects, which holds no lock that
    # stops a reader or writer of either table: in the column's transaction it held
    # blob_deletions for the whole scan (1.3-2.0 s on 2M objects), and every output
    # URL granted (being_deleted), object deleted and blob swept waited for it. A
    # deletion recorded meanwhile is one the scan sees whole (its object's deleted_at
    # is committed with it) or not at all; a key written between the scan's read and
    # its write keeps its record. The column may be there already when the migration
    # is run again (it was committed before the scan).
    op.add_column("blob_deletions", column, if_not_exists=True)
    with op.get_context().autocommit_block():
        op.execute(_copies_left().on_conflict_do_nothing(index_elements=["storage_key"]))


def _copies_left() -> Any:
    """The records of the copies of objects deleted before 0029 (migrated, deleted,
    with no record of their key): due at once, with their backend. On PostgreSQL a
    dialect insert (the caller adds its ON CONFLICT)."""
    objects = sa.table(
        "objects",
        *map(sa.column, ("object_id", "storage_key", "deleted_at", "storage_backend")),
    )
    deletions = sa.table(
        "blob_deletions",
        *map(
            sa.column,
            (
                "storage_key",
                "object_id",
                "requested_at",
                "attempts",
                "next_attempt_at",
                "storage_backend",
            ),
        ),
    )
    o = objects.c
    left = sa.select(
        o.storage_key, o.object_id, o.deleted_at, sa.literal(0), o.deleted_at, o.storage_backend
    ).where(
        o.deleted_at.is_not(None),
        o.storage_backend.is_not(None),
        ~sa.exists().where(deletions.c.storage_key == o.storage_key),
    )
    insert = postgresql.insert if op.get_bind().dialect.name == "postgresql" else sa.insert
    return insert(deletions).from_select(list(deletions.c.keys()), left)


def downgrade() -> None:
    with op.batch_alter_table("blob_deletions", schema=None) as batch_op:
        batch_op.drop_column("storage_backend")
