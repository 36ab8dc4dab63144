"""The record's tables (:mod:`hypermedia.db.models`) by the short names queries use."""

from __future__ import annotations

from hypermedia.db.models import (
    alert_deliveries,
    alerts,
    api_keys,
    blob_deletions,
    bulk_runs,
    cloud_spend,
    credit_accounts,
    credit_ledger,
    job_attempts,
    job_callbacks,
    job_checkpoints,
    job_outputs,
    objects,
    pool_members,
    pools,
    processing_jobs,
    processing_profiles,
    queue_samples,
    scheduler_decisions,
    scheduler_state,
    submissions,
    users,
    worker_metrics,
    workers,
)

profiles = processing_profiles
jobs = processing_jobs
attempts = job_attempts
outputs = job_outputs
checkpoints = job_checkpoints
callbacks = job_callbacks

__all__ = [
    "alert_deliveries",
    "alerts",
    "api_keys",
    "attempts",
    "blob_deletions",
    "bulk_runs",
    "callbacks",
    "checkpoints",
    "cloud_spend",
    "credit_accounts",
    "credit_ledger",
    "jobs",
    "objects",
    "outputs",
    "pool_members",
    "pools",
    "profiles",
    "queue_samples",
    "scheduler_decisions",
    "scheduler_state",
    "submissions",
    "users",
    "worker_metrics",
    "workers",
]
