"""processing_jobs.callback_status and callback_attempts: what became of a job's
callback once its outbox row (``job_callbacks``) is deleted by the head's maintenance
(``delivered`` or ``failed``, after how many attempts), written in the transaction that
deletes the row. Without them a job whose callback was given up showed no ``callback``
once the outbox had pruned it, as if none had been asked for. NULL: the outbox still
holds the row, or the job named no callback (no row is rewritten).

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-12 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain nullable ADD COLUMNs: no rewrite on PostgreSQL, a moment's lock under the
    # migration's lock_timeout; no batch on SQLite (its copy of a table others refer to).
    op.add_column("processing_jobs", sa.Column("callback_status", sa.String(16)))
    op.add_column("processing_jobs", sa.Column("callback_attempts", sa.Integer()))


def downgrade() -> None:
    op.drop_column("processing_jobs", "callback_attempts")  # SQLite >= 3.35: in place
    op.drop_column("processing_jobs", "callback_status")
