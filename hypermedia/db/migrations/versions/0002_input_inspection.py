"""input inspection: objects.inspection, profile accepts and input limits

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 18:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("objects", schema=None) as batch_op:
        batch_op.add_column(sa.Column("inspection", sa.JSON(), nullable=True))
    with op.batch_alter_table("processing_profiles", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("accepts", sa.JSON(), nullable=False, server_default=sa.text("'[\"any\"]'"))
        )
        batch_op.add_column(
            sa.Column("input_limits", sa.JSON(), nullable=False, server_default=sa.text("'{}'"))
        )


def downgrade() -> None:
    with op.batch_alter_table("processing_profiles", schema=None) as batch_op:
        batch_op.drop_column("input_limits")
        batch_op.drop_column("accepts")
    with op.batch_alter_table("objects", schema=None) as batch_op:
        batch_op.drop_column("inspection")
