"""Redis priority queues: the key schema (``keys``), Lua scripts (``scripts/``),
the client (``redis_queue``), the reaper and the reconciler."""
