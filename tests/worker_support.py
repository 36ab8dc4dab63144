"""A worker's loops in the test's own process, on a stack of the test's: for the tests
of claiming, completing, pausing and draining (the pipeline actor builds the same
:class:`~hypermedia.worker.worker.Worker` around a sandboxed executor)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.in_process import InProcessExecutor
from hypermedia.stack import Stack
from hypermedia.storage.grants import OutputGrant
from hypermedia.worker.execute import JobExecution
from hypermedia.worker.worker import Worker
from tests.pipelines_for_tests import PRELOAD


class NoGrants:
    """Grants that must not be asked: a no-input, no-output job needs none."""

    def __init__(self) -> None:
        self.calls = 0

    def input_url(self, job_id: str, worker_id: str) -> str:
        self.calls += 1
        raise AssertionError("a job that needs no input asked for its input URL")

    def output_urls(
        self, job_id: str, worker_id: str, output_types: Mapping[str, str | None]
    ) -> dict[str, OutputGrant]:
        self.calls += 1
        raise AssertionError("a job with no outputs asked for output URLs")

    def checkpoint_uploads(self, job_id, worker_id, names):
        raise AssertionError("a step without checkpoints asked to store one")

    def checkpoint_downloads(self, job_id, worker_id):
        raise AssertionError("a step without checkpoints asked for its checkpoints")


def loop_worker(
    stack: Stack,
    work: Path,
    worker_id: str,
    *,
    queue: str = "images",
    concurrency: int = 1,
    executor: Any = None,
    grants: Any = None,
    **options: Any,
) -> Worker:
    """A worker of ``stack`` (not started) whose jobs run in ``executor`` (default: in
    this process, the test steps preloaded) with ``work`` as its work root; ``options``
    go to :class:`Worker` (prefetch, heartbeat_seconds, clock ...)."""
    executor = executor or InProcessExecutor(work, PRELOAD)
    grants = NoGrants() if grants is None else grants
    options.setdefault("clock", stack.clock)
    return Worker(
        worker_id=worker_id,
        queue=queue,
        concurrency=concurrency,
        engine=stack.engine,
        dispatcher=stack.dispatcher,
        execution=JobExecution(stack.dispatcher, stack.catalog, grants, executor, worker_id),
        work_root=str(work),
        **options,
    )
