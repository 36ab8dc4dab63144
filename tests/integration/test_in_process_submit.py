"""The README's in-process submit (a web tier on the head's host), run as written: its
settings from the environment, the caller from the user's API key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from hypermedia.errors import AuthenticationFailed
from tests import support
from tests.factories import image_inspection, make_object, make_user, open_stack

README = Path(__file__).resolve().parents[2] / "README.md"


def _example() -> str:
    blocks: list[str] = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    (example,) = [b for b in blocks if "Stack.open(" in b]
    return example


def test_the_readmes_in_process_submit_runs_as_written(
    engine, settings, manual_clock, redis_url, redis_prefix, tmp_path, monkeypatch
):
    setup = open_stack(settings, engine, manual_clock)
    person = make_user(setup)
    object_id = make_object(setup, person, inspection=image_inspection())
    # The head's settings, as its environment gives them.
    for name, value in {
        "DATABASE_URL": support.url_string(engine),
        "REDIS_URL": redis_url,
        "REDIS_PREFIX": redis_prefix,
        "DATA_DIR": str(tmp_path),
    }.items():
        monkeypatch.setenv(f"HYPERMEDIA_{name}", value)

    namespace: dict[str, Any] = {}
    exec(compile(_example(), "README.md", "exec"), namespace)
    try:
        job_ids = namespace["submit"](person.api_key, object_id, ["thumbnail"])
        assert len(job_ids) == 1
        job = setup.ingest.get_job(person.caller, job_ids[0])
        assert (job.operation, job.status) == ("thumbnail", "queued")
        assert setup.queue.ready_ids(job.queue) == job_ids
        with pytest.raises(AuthenticationFailed):
            namespace["submit"](person.api_key + "x", object_id, ["thumbnail"])
    finally:
        namespace["stack"].close()
        setup.close()
