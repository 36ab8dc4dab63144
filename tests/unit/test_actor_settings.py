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


def test_a_death_reason_names_what_the_creation_task_raised():
    from hypermedia.worker.supervisor import death_reason

    raised = RuntimeError(
        "The actor died because of an error raised in its creation task, ray::media-1.__init__()\n"
        "Traceback (most recent call last):\n  File 'x.py', line 1\n"
        "FileNotFoundError: [Errno 2] No such file or directory: '/tmp/gone'\n"
    )
    said = death_reason(raised)
    assert said.startswith("The actor died because of an error raised in its creation task")
    assert said.endswith("FileNotFoundError: [Errno 2] No such file or directory: '/tmp/gone'")
    assert death_reason(RuntimeError("")) == "actor died"
    assert death_reason(RuntimeError("one line")) == "one line"


def test_a_system_death_keeps_what_ray_said_happened():
    from hypermedia.worker.supervisor import death_reason

    raised = RuntimeError(
        "The actor died unexpectedly before finishing this task.\n"
        "\tclass_name: PipelineActor\n\tactor_id: 1f2e\n\tpid: 0\n\tname: bulk-1\n"
        "\tnamespace: hypermedia\n\tip: 127.0.0.1\n"
        "The worker process failed to register within the timeout.\n"
        "The actor never ran - it was cancelled before it started running.\n"
    )
    assert death_reason(raised) == (
        "The actor died unexpectedly before finishing this task."
        " The worker process failed to register within the timeout."
        " The actor never ran - it was cancelled before it started running."
    )


def test_no_secret_setting_reaches_the_actors(tmp_path):
    """The callback secret (the head's sender signs webhooks) and a client's API key
    are the head's alone. Handed over, the callback secret came masked, ten asterisks,
    and every actor refused to start (callback_secret: at least 32 characters): with
    HYPERMEDIA_CALLBACK_SECRET set, `hypermedia up` never came up; the API key went in
    clear into Ray's actor table."""
    callback = "canary-callback-secret-" + "c" * 20
    api_key = "hm_canary-api-key-" + "k" * 20
    settings = load_settings(data_dir=tmp_path, callback_secret=callback, api_key=api_key)
    data = settings_for_actors(settings, "redis://127.0.0.1:1/0")
    assert not {"callback_secret", "api_key"} & set(data)
    dumped = json.dumps(data)
    assert callback not in dumped
    assert api_key not in dumped
    actor = load_settings(**data)  # what each actor does first
    assert actor.callback_secret is None
    assert actor.api_key is None
