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

import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("blob_deletions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("storage_backend", sa.String(length=64), nullable=True))
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
    op.execute(deletions.insert().from_select(list(deletions.c.keys()), left))


def downgrade() -> None:
    with op.batch_alter_table("blob_deletions", schema=None) as batch_op:
        batch_op.drop_column("storage_backend")
