"""unit costs: processing_profiles.unit_costs_millicredits (the price of each unit of
work a step reports, e.g. an ocr page's escalation) and job_attempts.units (what the
attempt's step reported)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 16:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("processing_profiles", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "unit_costs_millicredits", sa.JSON(), nullable=False, server_default=sa.text("'{}'")
            )
        )
    with op.batch_alter_table("job_attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("units", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_attempts", schema=None) as batch_op:
        batch_op.drop_column("units")
    with op.batch_alter_table("processing_profiles", schema=None) as batch_op:
        batch_op.drop_column("unit_costs_millicredits")
