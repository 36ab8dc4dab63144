"""A job cannot read the files that hold the stack's secrets, wherever the operator
keeps them: the settings file (``HYPERMEDIA_CONFIG``), the Ray token
(``RAY_AUTH_TOKEN_PATH``, ``--token-file``), the alert webhooks file.

Each test builds a pipeline actor's executor the way production does: the head loads
its settings from the file, hands the actor :func:`settings_for_actors`, and the actor
runs with its raylet's environment (:func:`cluster.ray_environment`: no
``HYPERMEDIA_CONFIG`` there) and :meth:`PipelineService.make_executor`. A real job
then tries to read each file through the real sandbox (root: own uid, mount namespace).

Each file is ``0644``, as a file written with the usual umask is: only the sandbox's
view can keep a job from it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hypermedia import workdirs
from hypermedia.config import load_settings
from hypermedia.worker import cluster
from hypermedia.worker.actor import PipelineService
from hypermedia.worker.supervisor import settings_for_actors
from tests.pipelines_for_tests import PRELOAD

pytestmark = pytest.mark.root("the full sandbox needs root")

STORAGE_SECRET = "canary-storage-secret-0123456789abcdef"
DB_PASSWORD = "canary-db-password"
TOKEN = "canary-ray-token-0123456789"
WEBHOOK_SECRET = "canary-webhook-secret-0123"


@pytest.fixture(params=["/opt", "/srv", "/etc", "/root"])
def site(request: pytest.FixtureRequest) -> Iterator[Path]:
    """An operator's directory: outside every default cover (``/etc/<site>``, not
    ``/etc/hypermedia``), or under one (``/root``)."""
    directory = Path(tempfile.mkdtemp(prefix="hm-site-", dir=request.param))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o644)
    return path


def _config(site: Path, data_dir: Path) -> Path:
    return _write(
        site / "hm.toml",
        f'data_dir = "{data_dir}"\n'
        f'storage_secret = "{STORAGE_SECRET}"\n'
        f'database_url = "postgresql://hm:{DB_PASSWORD}@127.0.0.1:5432/hm"\n',
    )


def _actor_executor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, head_env: dict[str, str], token: Path
) -> Any:
    """The executor of a pipeline actor started by a head that has ``head_env``."""
    for name, value in head_env.items():
        monkeypatch.setenv(name, value)
    # The head reads HYPERMEDIA_CONFIG, which it refuses while others may read it (a
    # secret there); the job is tested against the file made readable by anyone after.
    config = Path(head_env["HYPERMEDIA_CONFIG"])
    config.chmod(0o600)
    head = load_settings()
    config.chmod(0o644)
    assert head.storage_secret is not None
    actor_settings = settings_for_actors(head, "redis://127.0.0.1:6379/0")
    # The actor's process has its raylet's environment, which `ray start` got from
    # ray_environment (Ray adds only variables of its own).
    actor_env = cluster.ray_environment(token, loopback=True)
    for name in list(os.environ):
        monkeypatch.delenv(name)
    for name, value in actor_env.items():
        monkeypatch.setenv(name, value)
    cfg = load_settings(**actor_settings)
    work_root = workdirs.worker_root(cfg.data_dir, "w1")
    actor = SimpleNamespace(job_cpus=1)
    return PipelineService.make_executor(actor, work_root, PRELOAD, cfg)  # type: ignore[arg-type]


def _read(ex: Any, paths: list[str]) -> dict[str, str]:
    source = ex.prepare("secret-job") / "input" / "source"
    source.write_bytes(b"x")
    result = ex.run(
        "secret-job",
        "test.read_bytes",
        source,
        {"read": paths},
        timeout_seconds=10,
        memory_limit_mb=1024,
    )
    [output] = result.outputs
    seen: dict[str, str] = json.loads(output.path.read_text())
    ex.cleanup("secret-job")
    return seen


def _leaked(seen: dict[str, str]) -> dict[str, str]:
    canaries = (STORAGE_SECRET, DB_PASSWORD, TOKEN, WEBHOOK_SECRET)
    return {path: text for path, text in seen.items() if any(c in text for c in canaries)}


def test_the_settings_file_is_hidden_from_jobs(site, tmp_path, monkeypatch):
    config = _config(site, tmp_path / "data")
    token = cluster.ensure_token(tmp_path / "data" / "ray" / "auth_token")
    with _actor_executor(tmp_path, monkeypatch, {"HYPERMEDIA_CONFIG": str(config)}, token) as ex:
        assert ex.capabilities["missing"] == {}
        seen = _read(ex, [str(config)])
    assert _leaked(seen) == {}, seen


def test_a_relative_settings_file_in_the_heads_directory_is_hidden(site, tmp_path, monkeypatch):
    """``HYPERMEDIA_CONFIG=hm.toml`` in the directory the operator started from, which
    Ray puts on every actor's sys.path."""
    config = _config(site, tmp_path / "data")
    token = cluster.ensure_token(tmp_path / "data" / "ray" / "auth_token")
    monkeypatch.chdir(site)
    monkeypatch.syspath_prepend(str(site))  # Ray: the driver's directory, for the actors
    with _actor_executor(tmp_path, monkeypatch, {"HYPERMEDIA_CONFIG": "hm.toml"}, token) as ex:
        seen = _read(ex, [str(config)])
    assert _leaked(seen) == {}, seen


def test_the_ray_token_and_the_webhooks_file_are_hidden_from_jobs(site, tmp_path, monkeypatch):
    """A worker node's ``--token-file`` copied where the operator keeps it, and the
    alert webhooks file named by ``HYPERMEDIA_ALERT_WEBHOOKS``."""
    config = _config(site, tmp_path / "data")
    token = _write(site / "ray-token", TOKEN)
    hooks = _write(
        site / "alert-webhooks.json",
        json.dumps(
            {
                "webhooks": [
                    {"name": "ops", "url": "https://x.example/hook", "secret": WEBHOOK_SECRET}
                ]
            }
        ),
    )
    head_env = {
        "HYPERMEDIA_CONFIG": str(config),
        "HYPERMEDIA_RAY_TOKEN_FILE": str(token),
        "HYPERMEDIA_ALERT_WEBHOOKS": str(hooks),
    }
    with _actor_executor(tmp_path, monkeypatch, head_env, token) as ex:
        seen = _read(ex, [str(token), str(hooks)])
    assert _leaked(seen) == {}, seen


def test_a_hidden_path_that_is_a_file_is_hidden(site, tmp_path):
    """``hidden_paths`` may name a file: the view hides it as it hides a directory."""
    from hypermedia.sandbox.executor import ChildExecutor

    secret = _write(site / "secret.txt", STORAGE_SECRET)
    beside = _write(site / "beside.txt", "not a secret")
    with ChildExecutor(tmp_path / "work", PRELOAD, spares=0, hidden_paths=(secret,)) as ex:
        seen = _read(ex, [str(secret), str(beside)])
    assert _leaked(seen) == {}, seen
    if not str(site).startswith("/root/"):  # /root is an empty cover anyway
        assert seen[str(beside)] == "not a secret"  # only the file, not its directory
