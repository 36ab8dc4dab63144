"""The Celery side of ``bench/e2e.py``: the pipeline steps as Celery tasks.

A task runs one step on a file in a fresh working directory and counts itself done (or
failed) in Redis; no sandbox, no durable record, results ignored. The broker is
``HM_E2E_BROKER`` (a Redis URL).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import redis
from celery import Celery

app = Celery("hm_e2e", broker=os.environ.get("HM_E2E_BROKER", "redis://127.0.0.1:6379/15"))
app.conf.update(
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)
_counter: redis.Redis | None = None


@app.task(name="hm_e2e.run_step")  # type: ignore[untyped-decorator,unused-ignore]
def run_step(operation: str, path: str, params: dict[str, Any], key: str) -> None:
    global _counter
    from pipelines import registry

    registry.load_all()
    if _counter is None:
        _counter = redis.Redis.from_url(app.conf.broker_url)
    workdir = Path(tempfile.mkdtemp(prefix="hm-e2e-celery-"))
    try:
        registry.get(operation)(Path(path), params, workdir)
        _counter.hincrby(key, "done", 1)
    except Exception:  # counted as the peer's failure, like ours
        _counter.hincrby(key, "failed", 1)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
