"""Redis priority queues: the key schema (``keys``), Lua scripts (``scripts/``) and
the client (``redis_queue``). The bottom layer: it imports nothing from
:mod:`hypermedia.jobs` (the reaper and the reconciler, which read the job record,
live there); a test in ``tests/unit/test_purity.py`` keeps it so."""
