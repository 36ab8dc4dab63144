"""Bulk runs: regeneration, backfill and migration of existing objects (seed 003's
``bulk`` queue: "Batch regeneration, backfill, migration", priority 7-10).

- :mod:`~hypermedia.bulk.runs`: the durable record (``bulk_runs``: filter, cursor,
  counts, state) and its guarded state changes;
- :mod:`~hypermedia.bulk.select`: the keyset pages of objects a run deals with;
- :mod:`~hypermedia.bulk.runner`: the head's loop that turns pages into jobs (or copies,
  for a migration) within each run's cap of jobs in flight;
- :mod:`~hypermedia.bulk.service`: what an operator does (create, ``--dry-run``
  estimate, status, pause, resume, cancel), for the CLI and the operator-only API.

Bulk work is the platform's cost: its jobs belong to the platform's own user and
reserve nothing, unless the run names an account to charge (then each batch reserves
its jobs' reservations there first: estimates plus the most their priced units may
cost; a short account pauses the run with the reason).

Jobs go on the ``bulk`` queue by default (``--queue`` may name the operation's own
queue instead, at the same bulk priority); why, with the numbers, is in the bench
README's bulk section (bench/bulk.py measures both side by side).
"""
