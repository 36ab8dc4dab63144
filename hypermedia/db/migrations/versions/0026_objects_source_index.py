"""objects.source_object_id indexed (``ix_objects_source_object_id``): deleting an
object finds everything derived from it (a recursive query over this column, one
step a generation): without an index each step read the whole objects table.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-09 15:00:00.000000
"""

from __future__ import annotations

from hypermedia.db import online_ddl

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # On PostgreSQL built concurrently: a plain CREATE INDEX stopped every upload for
    # the whole build (see online_ddl).
    online_ddl.create_index("ix_objects_source_object_id", "objects", ["source_object_id"])


def downgrade() -> None:
    # On PostgreSQL dropped concurrently: a plain DROP INDEX takes an ACCESS EXCLUSIVE
    # lock on objects, which waits behind an upload in flight with every upload and
    # read of objects queued behind it (see online_ddl).
    online_ddl.drop_index("ix_objects_source_object_id", "objects")
