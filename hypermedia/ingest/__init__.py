"""Ingest: the submit path shared by the web tier and the HTTP API."""
