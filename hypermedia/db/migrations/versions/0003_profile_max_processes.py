"""processing_profiles.max_processes and max_output_bytes: RLIMIT_NPROC and
RLIMIT_FSIZE of a job's child, per profile

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 21:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("processing_profiles", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("max_processes", sa.Integer(), nullable=False, server_default="16")
        )
        batch_op.add_column(
            sa.Column(
                "max_output_bytes",
                sa.BigInteger(),
                nullable=False,
                server_default=str(10 * 1024**3),
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("processing_profiles", schema=None) as batch_op:
        batch_op.drop_column("max_output_bytes")
        batch_op.drop_column("max_processes")
