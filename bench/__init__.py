"""Benchmarks: ``python bench/ingest.py`` (see bench/README.md)."""
