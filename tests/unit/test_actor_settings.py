"""What the head hands its pipeline actors: settings they rebuild their connections from."""

from __future__ import annotations

import json

from hypermedia.config import load_settings
from hypermedia.worker.supervisor import NODE_SETTINGS, settings_for_actors


def test_no_storage_secret_reaches_the_actors(tmp_path):
    """Pipeline actors move bytes with per-job URLs; the grants actor gets the secret
    through the head's hand-off file (hypermedia.storage.credentials), not from here."""
    secret = "canary-storage-secret-" + "s" * 20
    settings = load_settings(data_dir=tmp_path, storage_secret=secret)
    data = settings_for_actors(settings, "redis://127.0.0.1:1/0")
    assert "storage_secret" not in data
    assert secret not in json.dumps(data)
    assert load_settings(**data).storage_secret is None


def test_node_facts_are_left_to_the_node(tmp_path):
    """A spot burst node's boot script sets HYPERMEDIA_SPOT_WATCH for the actors there;
    the head's own value must not override it."""
    settings = load_settings(data_dir=tmp_path, spot_watch="aws")
    data = settings_for_actors(settings, "redis://127.0.0.1:1/0")
    assert not set(NODE_SETTINGS) & set(data)
    assert data["redis_url"] == "redis://127.0.0.1:1/0"
    assert data["database_url"] == settings.effective_database_url
