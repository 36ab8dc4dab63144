"""The durable job record: tables (``models``), engines and sessions (``engine``),
Alembic migrations (``migrations/``, applied by ``hypermedia db upgrade``)."""
