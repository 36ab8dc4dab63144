"""blob_deletions.storage_backend: where a deleted object's verified copy was migrated
to (its objects.storage_backend when the deletion was recorded; NULL: the server's
storage only). The deleter deletes the key there too, not only in the server's storage
(a migration leaves the original there).

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


def downgrade() -> None:
    with op.batch_alter_table("blob_deletions", schema=None) as batch_op:
        batch_op.drop_column("storage_backend")
