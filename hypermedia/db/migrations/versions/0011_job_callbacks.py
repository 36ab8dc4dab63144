"""processing_jobs.callback_url and job_callbacks: the completion webhook a submit may
name, and the outbox of terminal events the head sends it from (written in the
transaction that makes the job completed, failed or cancelled)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import hypermedia.db.models

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("processing_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("callback_url", sa.String(length=2048), nullable=True))
    op.create_table(
        "job_callbacks",
        sa.Column("event_id", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("event", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.Column("last_attempt_at", hypermedia.db.models.UTCDateTime(), nullable=True),
        sa.Column("response_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("delivered_at", hypermedia.db.models.UTCDateTime(), nullable=True),
        sa.Column("created_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["processing_jobs.job_id"],
            name=op.f("fk_job_callbacks_job_id_processing_jobs"),
        ),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_job_callbacks")),
        sa.UniqueConstraint("job_id", name=op.f("uq_job_callbacks_job_id")),
    )
    with op.batch_alter_table("job_callbacks", schema=None) as batch_op:
        batch_op.create_index(
            "ix_job_callbacks_status_next_attempt_at", ["status", "next_attempt_at"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("job_callbacks", schema=None) as batch_op:
        batch_op.drop_index("ix_job_callbacks_status_next_attempt_at")
    op.drop_table("job_callbacks")
    with op.batch_alter_table("processing_jobs", schema=None) as batch_op:
        batch_op.drop_column("callback_url")
