"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29 17:03:13.989059
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import hypermedia.db.models

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cloud_spend",
        sa.Column(
            "spend_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("provider", sa.String(length=16), nullable=False),
        sa.Column("instance_id", sa.String(length=128), nullable=False),
        sa.Column("node_type", sa.String(length=64), nullable=False),
        sa.Column("region", sa.String(length=64), nullable=False),
        sa.Column("spot", sa.Boolean(), nullable=False),
        sa.Column("price_per_hour_microusd", sa.BigInteger(), nullable=False),
        sa.Column("launched_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.Column("terminated_at", hypermedia.db.models.UTCDateTime(), nullable=True),
        sa.Column("billed_microusd", sa.BigInteger(), nullable=True),
        sa.Column("reconciled_at", hypermedia.db.models.UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("spend_id", name=op.f("pk_cloud_spend")),
        sa.UniqueConstraint("provider", "instance_id", name="uk_spend_instance"),
    )
    op.create_table(
        "pools",
        sa.Column("pool_id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("pool_id", name=op.f("pk_pools")),
    )
    op.create_table(
        "processing_profiles",
        sa.Column("profile_id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("operation", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("queue", sa.String(length=32), nullable=False),
        sa.Column("base_cost_millicredits", sa.BigInteger(), nullable=False),
        sa.Column("cost_per_mb_millicredits", sa.BigInteger(), nullable=False),
        sa.Column("timeout_seconds", sa.Integer(), nullable=False),
        sa.Column("memory_limit_mb", sa.Integer(), nullable=False),
        sa.Column("max_input_bytes", sa.BigInteger(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("default_priority", sa.Integer(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.Column("created_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.Column("updated_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("profile_id", name=op.f("pk_processing_profiles")),
        sa.UniqueConstraint("operation", "version", name="uk_profile_operation_version"),
    )
    op.create_table(
        "scheduler_decisions",
        sa.Column(
            "decision_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("decided_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("queue", sa.String(length=32), nullable=True),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("provider", sa.String(length=16), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("applied", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("decision_id", name=op.f("pk_scheduler_decisions")),
    )
    with op.batch_alter_table("scheduler_decisions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_scheduler_decisions_decided_at"), ["decided_at"], unique=False
        )

    op.create_table(
        "users",
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("is_operator", sa.Boolean(), nullable=False),
        sa.Column("created_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("user_id", name=op.f("pk_users")),
        sa.UniqueConstraint("name", name=op.f("uq_users_name")),
    )
    op.create_table(
        "workers",
        sa.Column("worker_id", sa.String(length=64), nullable=False),
        sa.Column("queue", sa.String(length=32), nullable=False),
        sa.Column("node_id", sa.String(length=64), nullable=True),
        sa.Column("hostname", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("started_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.Column("last_heartbeat", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.Column("stopped_at", hypermedia.db.models.UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("worker_id", name=op.f("pk_workers")),
    )
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_workers_queue"), ["queue"], unique=False)

    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.String(length=16), nullable=False),
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.Column("revoked_at", hypermedia.db.models.UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.user_id"], name=op.f("fk_api_keys_user_id_users")
        ),
        sa.PrimaryKeyConstraint("key_id", name=op.f("pk_api_keys")),
    )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_keys_user_id"), ["user_id"], unique=False)

    op.create_table(
        "credit_accounts",
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("balance_millicredits", sa.BigInteger(), nullable=False),
        sa.Column("reserved_millicredits", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.user_id"], name=op.f("fk_credit_accounts_user_id_users")
        ),
        sa.PrimaryKeyConstraint("user_id", name=op.f("pk_credit_accounts")),
    )
    op.create_table(
        "objects",
        sa.Column("object_id", sa.String(length=32), nullable=False),
        sa.Column("pool_id", sa.String(length=64), nullable=False),
        sa.Column("owner_id", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("source_object_id", sa.String(length=32), nullable=True),
        sa.Column("storage_key", sa.String(length=512), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("content_type", sa.String(length=127), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=True),
        sa.Column("created_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["owner_id"], ["users.user_id"], name=op.f("fk_objects_owner_id_users")
        ),
        sa.ForeignKeyConstraint(
            ["pool_id"], ["pools.pool_id"], name=op.f("fk_objects_pool_id_pools")
        ),
        sa.ForeignKeyConstraint(
            ["source_object_id"],
            ["objects.object_id"],
            name=op.f("fk_objects_source_object_id_objects"),
        ),
        sa.PrimaryKeyConstraint("object_id", name=op.f("pk_objects")),
        sa.UniqueConstraint("storage_key", name=op.f("uq_objects_storage_key")),
    )
    with op.batch_alter_table("objects", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_objects_owner_id"), ["owner_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_objects_pool_id"), ["pool_id"], unique=False)

    op.create_table(
        "pool_members",
        sa.Column("pool_id", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(
            ["pool_id"], ["pools.pool_id"], name=op.f("fk_pool_members_pool_id_pools")
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.user_id"], name=op.f("fk_pool_members_user_id_users")
        ),
        sa.PrimaryKeyConstraint("pool_id", "user_id", name=op.f("pk_pool_members")),
    )
    op.create_table(
        "submissions",
        sa.Column("submission_id", sa.String(length=32), nullable=False),
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("estimated_millicredits", sa.BigInteger(), nullable=False),
        sa.Column("created_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.user_id"], name=op.f("fk_submissions_user_id_users")
        ),
        sa.PrimaryKeyConstraint("submission_id", name=op.f("pk_submissions")),
        sa.UniqueConstraint("user_id", "idempotency_key", name="uk_submission_key"),
    )
    op.create_table(
        "worker_metrics",
        sa.Column(
            "metric_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("worker_id", sa.String(length=64), nullable=False),
        sa.Column("recorded_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.Column("cpu_percent", sa.Float(), nullable=False),
        sa.Column("memory_mb", sa.Float(), nullable=False),
        sa.Column("disk_free_mb", sa.Float(), nullable=False),
        sa.Column("jobs_completed", sa.Integer(), nullable=False),
        sa.Column("jobs_failed", sa.Integer(), nullable=False),
        sa.Column("throughput_per_min", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["worker_id"], ["workers.worker_id"], name=op.f("fk_worker_metrics_worker_id_workers")
        ),
        sa.PrimaryKeyConstraint("metric_id", name=op.f("pk_worker_metrics")),
    )
    with op.batch_alter_table("worker_metrics", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_worker_metrics_worker_id"), ["worker_id"], unique=False
        )

    op.create_table(
        "processing_jobs",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("submission_id", sa.String(length=32), nullable=False),
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("object_id", sa.String(length=32), nullable=False),
        sa.Column("profile_id", sa.Integer(), nullable=False),
        sa.Column("operation", sa.String(length=64), nullable=False),
        sa.Column("queue", sa.String(length=32), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("estimated_millicredits", sa.BigInteger(), nullable=False),
        sa.Column("actual_millicredits", sa.BigInteger(), nullable=True),
        sa.Column("attempt_count", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("claimed_by", sa.String(length=64), nullable=True),
        sa.Column("claimed_at", hypermedia.db.models.UTCDateTime(), nullable=True),
        sa.Column("visibility_timeout", hypermedia.db.models.UTCDateTime(), nullable=True),
        sa.Column("run_after", hypermedia.db.models.UTCDateTime(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("error_code", sa.String(length=64), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("created_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.Column("queued_at", hypermedia.db.models.UTCDateTime(), nullable=True),
        sa.Column("started_at", hypermedia.db.models.UTCDateTime(), nullable=True),
        sa.Column("completed_at", hypermedia.db.models.UTCDateTime(), nullable=True),
        sa.Column("updated_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["object_id"], ["objects.object_id"], name=op.f("fk_processing_jobs_object_id_objects")
        ),
        sa.ForeignKeyConstraint(
            ["profile_id"],
            ["processing_profiles.profile_id"],
            name=op.f("fk_processing_jobs_profile_id_processing_profiles"),
        ),
        sa.ForeignKeyConstraint(
            ["submission_id"],
            ["submissions.submission_id"],
            name=op.f("fk_processing_jobs_submission_id_submissions"),
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.user_id"], name=op.f("fk_processing_jobs_user_id_users")
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_processing_jobs")),
    )
    with op.batch_alter_table("processing_jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_status_queue", ["status", "queue"], unique=False)
        batch_op.create_index("ix_jobs_status_run_after", ["status", "run_after"], unique=False)
        batch_op.create_index(
            "ix_jobs_status_visibility", ["status", "visibility_timeout"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_processing_jobs_object_id"), ["object_id"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_processing_jobs_submission_id"), ["submission_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_processing_jobs_user_id"), ["user_id"], unique=False)

    op.create_table(
        "credit_ledger",
        sa.Column(
            "entry_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("user_id", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("amount_millicredits", sa.BigInteger(), nullable=False),
        sa.Column("note", sa.String(length=255), nullable=False),
        sa.Column("created_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["processing_jobs.job_id"],
            name=op.f("fk_credit_ledger_job_id_processing_jobs"),
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.user_id"], name=op.f("fk_credit_ledger_user_id_users")
        ),
        sa.PrimaryKeyConstraint("entry_id", name=op.f("pk_credit_ledger")),
    )
    with op.batch_alter_table("credit_ledger", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_credit_ledger_job_id"), ["job_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_credit_ledger_user_id"), ["user_id"], unique=False)

    op.create_table(
        "job_attempts",
        sa.Column(
            "attempt_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("attempt_number", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error_code", sa.String(length=64), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("started_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.Column("finished_at", hypermedia.db.models.UTCDateTime(), nullable=True),
        sa.Column("duration_ms", sa.BigInteger(), nullable=True),
        sa.Column("peak_memory_mb", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["processing_jobs.job_id"],
            name=op.f("fk_job_attempts_job_id_processing_jobs"),
        ),
        sa.PrimaryKeyConstraint("attempt_id", name=op.f("pk_job_attempts")),
        sa.UniqueConstraint("job_id", "attempt_number", name="uk_attempt_number"),
    )
    op.create_table(
        "job_outputs",
        sa.Column(
            "output_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("output_type", sa.String(length=64), nullable=False),
        sa.Column("profile_version", sa.Integer(), nullable=False),
        sa.Column("object_id", sa.String(length=32), nullable=True),
        sa.Column("storage_key", sa.String(length=512), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("content_type", sa.String(length=127), nullable=True),
        sa.Column("created_at", hypermedia.db.models.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["processing_jobs.job_id"],
            name=op.f("fk_job_outputs_job_id_processing_jobs"),
        ),
        sa.ForeignKeyConstraint(
            ["object_id"], ["objects.object_id"], name=op.f("fk_job_outputs_object_id_objects")
        ),
        sa.PrimaryKeyConstraint("output_id", name=op.f("pk_job_outputs")),
        sa.UniqueConstraint("job_id", "output_type", "profile_version", name="uk_job_type_profile"),
    )


def downgrade() -> None:
    op.drop_table("job_outputs")
    op.drop_table("job_attempts")
    with op.batch_alter_table("credit_ledger", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_credit_ledger_user_id"))
        batch_op.drop_index(batch_op.f("ix_credit_ledger_job_id"))

    op.drop_table("credit_ledger")
    with op.batch_alter_table("processing_jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_processing_jobs_user_id"))
        batch_op.drop_index(batch_op.f("ix_processing_jobs_submission_id"))
        batch_op.drop_index(batch_op.f("ix_processing_jobs_object_id"))
        batch_op.drop_index("ix_jobs_status_visibility")
        batch_op.drop_index("ix_jobs_status_run_after")
        batch_op.drop_index("ix_jobs_status_queue")

    op.drop_table("processing_jobs")
    with op.batch_alter_table("worker_metrics", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_worker_metrics_worker_id"))

    op.drop_table("worker_metrics")
    op.drop_table("submissions")
    op.drop_table("pool_members")
    with op.batch_alter_table("objects", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_objects_pool_id"))
        batch_op.drop_index(batch_op.f("ix_objects_owner_id"))

    op.drop_table("objects")
    op.drop_table("credit_accounts")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_keys_user_id"))

    op.drop_table("api_keys")
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_workers_queue"))

    op.drop_table("workers")
    op.drop_table("users")
    with op.batch_alter_table("scheduler_decisions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_scheduler_decisions_decided_at"))

    op.drop_table("scheduler_decisions")
    op.drop_table("processing_profiles")
    op.drop_table("pools")
    op.drop_table("cloud_spend")
