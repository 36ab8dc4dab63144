"""Core ``Table`` handles for the mapped classes, for fast guarded SQL."""

from __future__ import annotations

from typing import cast

from sqlalchemy import Table

from hypermedia.db import models as m


def _t(model: type[m.Base]) -> Table:
    return cast(Table, model.__table__)


users = _t(m.User)
pools = _t(m.Pool)
pool_members = _t(m.PoolMember)
objects = _t(m.StoredObject)
api_keys = _t(m.ApiKey)
credit_accounts = _t(m.CreditAccount)
credit_ledger = _t(m.CreditLedger)
profiles = _t(m.ProcessingProfile)
submissions = _t(m.Submission)
jobs = _t(m.ProcessingJob)
attempts = _t(m.JobAttempt)
outputs = _t(m.JobOutput)
checkpoints = _t(m.JobCheckpoint)
blob_deletions = _t(m.BlobDeletion)
callbacks = _t(m.JobCallback)
workers = _t(m.Worker)
worker_metrics = _t(m.WorkerMetric)
scheduler_decisions = _t(m.SchedulerDecision)
scheduler_state = _t(m.SchedulerState)
queue_samples = _t(m.QueueSample)
cloud_spend = _t(m.CloudSpend)
alerts = _t(m.Alert)
alert_deliveries = _t(m.AlertDelivery)
bulk_runs = _t(m.BulkRun)
