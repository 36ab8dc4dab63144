"""alerts and alert_deliveries: every notification of the alert rules, and each one's
delivery to each webhook (the outbox the sender works through)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import hypermedia.db.models

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column(
            "alert_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("rule", sa.String(length=32), nullable=False),
        sa.Column("level", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("started_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.Column("notified_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("alert_id", name=op.f("pk_alerts")),
    )
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_alerts_key"), ["key"], unique=False)
        batch_op.create_index(batch_op.f("ix_alerts_notified_at"), ["notified_at"], unique=False)

    op.create_table(
        "alert_deliveries",
        sa.Column("delivery_id", sa.String(length=32), nullable=False),
        sa.Column("alert_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("webhook", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.Column("last_attempt_at", hypermedia.db.models.UTCDateTime(), nullable=True),
        sa.Column("response_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("delivered_at", hypermedia.db.models.UTCDateTime(), nullable=True),
        sa.Column("created_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["alert_id"], ["alerts.alert_id"], name=op.f("fk_alert_deliveries_alert_id_alerts")
        ),
        sa.PrimaryKeyConstraint("delivery_id", name=op.f("pk_alert_deliveries")),
    )
    with op.batch_alter_table("alert_deliveries", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_alert_deliveries_alert_id"), ["alert_id"], unique=False
        )
        batch_op.create_index(
            "ix_alert_deliveries_status_next_attempt_at",
            ["status", "next_attempt_at"],
            unique=False,
        )


def downgrade() -> None:
    with op.batch_alter_table("alert_deliveries", schema=None) as batch_op:
        batch_op.drop_index("ix_alert_deliveries_status_next_attempt_at")
        batch_op.drop_index(batch_op.f("ix_alert_deliveries_alert_id"))
    op.drop_table("alert_deliveries")
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_alerts_notified_at"))
        batch_op.drop_index(batch_op.f("ix_alerts_key"))
    op.drop_table("alerts")
