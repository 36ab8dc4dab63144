"""The durable job record: tables (``models``), engines and sessions (``engine``),
Alembic migrations (``migrations/``, applied by ``hypermedia db upgrade``)."""

# The least of the PostgreSQL server's limits (engine.STATEMENT_SECONDS) but none (0):
# PostgreSQL counts each in whole milliseconds and reads 0 as no limit, so a lock wait of
# a third of less (0.0015 s and below: lock_timeout rounded to 0, and statement_timeout too
# at 0.0005) was no bound at all. The settings refuse less; a caller's smaller value gets
# 1 ms for each (engine.statement_limits). Here, not in ``engine``: the settings check it
# without importing SQLAlchemy (a client command, ``hypermedia status JOB_ID``, needs none).
MIN_STATEMENT_SECONDS = 0.003
