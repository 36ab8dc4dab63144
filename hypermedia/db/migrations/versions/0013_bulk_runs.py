"""bulk_runs (an operator's regeneration, backfill or migration, durable: its filter,
cursor, counts and state), processing_jobs.bulk_run_id (a run's jobs: one per object,
unique, so a run resumed after a crash never creates one twice) and
objects.storage_backend (where the object's verified copy lives after a migration;
NULL: the server's configured storage)

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02 19:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import hypermedia.db.models
from hypermedia.db import online_ddl

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


FOREIGN_KEY = "fk_processing_jobs_bulk_run_id_bulk_runs"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _upgrade_postgresql()
        return
    _create_bulk_runs()
    with op.batch_alter_table("processing_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("bulk_run_id", sa.String(length=32), nullable=True))
        batch_op.create_foreign_key(
            batch_op.f(FOREIGN_KEY),
            "bulk_runs",
            ["bulk_run_id"],
            ["run_id"],
        )
        batch_op.create_index("uk_jobs_bulk_run_object", ["bulk_run_id", "object_id"], unique=True)
        batch_op.create_index("ix_jobs_bulk_run_status", ["bulk_run_id", "status"], unique=False)
    with op.batch_alter_table("objects", schema=None) as batch_op:
        batch_op.add_column(sa.Column("storage_backend", sa.String(length=64), nullable=True))


def _upgrade_postgresql() -> None:
    """The same schema without holding processing_jobs while its rows are read: in one
    transaction, ADD COLUMN's ACCESS EXCLUSIVE lock on processing_jobs was held while
    the foreign key was checked against every job and both indexes were built, and
    every submit, claim and completion (and read of a job) waited for them. Now the
    new table, the columns and the foreign key, NOT VALID (checked for rows written
    from then on, without reading the others), are one transaction of moments; the
    key is then validated in a transaction of its own (SHARE UPDATE EXCLUSIVE on
    processing_jobs: reads and writes go on) and the indexes built concurrently
    (online_ddl). A run cut short after that first transaction committed finds its
    foreign key there and goes on from the validation."""
    conn = op.get_bind()
    done = conn.execute(
        sa.text(
            "SELECT 1 FROM pg_constraint WHERE conname = :name"
            " AND conrelid = 'processing_jobs'::regclass"
        ),
        {"name": FOREIGN_KEY},
    ).scalar()
    if not done:
        _create_bulk_runs()
        op.add_column("processing_jobs", sa.Column("bulk_run_id", sa.String(length=32)))
        op.create_foreign_key(
            op.f(FOREIGN_KEY),
            "processing_jobs",
            "bulk_runs",
            ["bulk_run_id"],
            ["run_id"],
            postgresql_not_valid=True,
        )
        op.add_column("objects", sa.Column("storage_backend", sa.String(length=64)))
    online_ddl.validate_constraint(FOREIGN_KEY, "processing_jobs")
    online_ddl.create_index(
        "uk_jobs_bulk_run_object", "processing_jobs", ["bulk_run_id", "object_id"], unique=True
    )
    online_ddl.create_index("ix_jobs_bulk_run_status", "processing_jobs", ["bulk_run_id", "status"])


def _create_bulk_runs() -> None:
    op.create_table(
        "bulk_runs",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("operation", sa.String(length=64), nullable=True),
        sa.Column("profile_id", sa.Integer(), nullable=True),
        sa.Column("target_version", sa.Integer(), nullable=True),
        sa.Column("filter", sa.JSON(), nullable=False),
        sa.Column("target", sa.JSON(), nullable=True),
        sa.Column("queue", sa.String(length=32), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("max_in_flight", sa.Integer(), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("account_user_id", sa.String(length=32), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("cursor", sa.String(length=32), nullable=True),
        sa.Column("scanned", sa.BigInteger(), nullable=False),
        sa.Column("created_jobs", sa.BigInteger(), nullable=False),
        sa.Column("skipped", sa.BigInteger(), nullable=False),
        sa.Column("unfit", sa.BigInteger(), nullable=False),
        sa.Column("migrated", sa.BigInteger(), nullable=False),
        sa.Column("failed", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_by", sa.String(length=200), nullable=True),
        sa.Column("created_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.Column("updated_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.Column("finished_at", hypermedia.db.models.UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["account_user_id"],
            ["users.user_id"],
            name=op.f("fk_bulk_runs_account_user_id_users"),
        ),
        sa.ForeignKeyConstraint(
            ["profile_id"],
            ["processing_profiles.profile_id"],
            name=op.f("fk_bulk_runs_profile_id_processing_profiles"),
        ),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_bulk_runs")),
    )
    with op.batch_alter_table("bulk_runs", schema=None) as batch_op:
        batch_op.create_index("ix_bulk_runs_state", ["state"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("objects", schema=None) as batch_op:
        batch_op.drop_column("storage_backend")
    with op.batch_alter_table("processing_jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_bulk_run_status")
        batch_op.drop_index("uk_jobs_bulk_run_object")
        batch_op.drop_constraint(batch_op.f(FOREIGN_KEY), type_="foreignkey")
        batch_op.drop_column("bulk_run_id")
    with op.batch_alter_table("bulk_runs", schema=None) as batch_op:
        batch_op.drop_index("ix_bulk_runs_state")
    op.drop_table("bulk_runs")
