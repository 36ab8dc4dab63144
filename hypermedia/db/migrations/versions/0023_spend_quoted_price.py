"""cloud_spend.quoted_per_hour_microusd: the price a launch was chosen at when the caps
count a higher one. A spot instance bills the market price of each moment, which may
rise after its launch up to its maximum (AWS: spot_max_price, else the on-demand price;
Google: the on-demand price), so its row's price_per_hour_microusd is that maximum and
the market price at launch is kept here for the bill's reconciliation. NULL (every row
from before, every on-demand row): the row's price.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-08 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "cloud_spend", sa.Column("quoted_per_hour_microusd", sa.BigInteger(), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("cloud_spend", "quoted_per_hour_microusd")  # SQLite >= 3.35: in place
