"""blob_deletions.claimed_until: on SQLite a blob is deleted with no transaction open
(one would hold the whole database's write lock for as long as the storage takes), the
record claimed first until then; no job is granted its key to write meanwhile.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-10 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import hypermedia.db.models

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("blob_deletions", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("claimed_until", hypermedia.db.models.UTCDateTime(), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("blob_deletions", schema=None) as batch_op:
        batch_op.drop_column("claimed_until")
