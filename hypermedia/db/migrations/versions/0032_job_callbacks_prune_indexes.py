"""job_callbacks: the rows the head's maintenance prunes found by when they ended
(``ix_job_callbacks_status_delivered_at``, ``ix_job_callbacks_status_last_attempt_at``).
The prune (:func:`hypermedia.jobs.callbacks.prune`) looked for them through
``ix_job_callbacks_status_next_attempt_at``, filtering on when they ended: with fewer
than a batch past retention, as every round once a backlog is gone, it read every row
of the status still kept (a day of deliveries, a week of give-ups) every 5 minutes
(200k delivered rows on PostgreSQL: a parallel scan of the whole table, 25-70 ms, for
0 rows; 80-170 ms on SQLite).

Whole indexes, not partial ones over a status: PostgreSQL leaves out of an index scan
the conditions the index's predicate implies (``status = 'delivered'``), so (status,
delivered_at) over the delivered rows was read whole, and SQLite, which keeps no
statistics unless asked, preferred the status's index to one on (delivered_at) alone.

On PostgreSQL built concurrently (online_ddl): deliveries go on meanwhile.

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-13 12:00:00.000000
"""

from __future__ import annotations

from hypermedia.db import online_ddl

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None

_INDEXES = (
    ("ix_job_callbacks_status_delivered_at", "delivered_at"),
    ("ix_job_callbacks_status_last_attempt_at", "last_attempt_at"),
)


def upgrade() -> None:
    for name, column in _INDEXES:
        online_ddl.create_index(name, "job_callbacks", ["status", column])


def downgrade() -> None:
    for name, _column in reversed(_INDEXES):
        online_ddl.drop_index(name, "job_callbacks")
