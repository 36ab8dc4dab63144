"""Benchmark only: pipeline steps run in the worker's own process.

:class:`InProcessExecutor` has the executor interface of
:class:`~hypermedia.sandbox.executor.ChildExecutor` without the child: no address
space of its own, no rlimits, no wall clock, no kill on cancel. It exists so
``bench/throughput.py`` can measure the job path (Redis, the record, the actor)
apart from the per-job child, with :func:`in_process_actor`'s pipeline actor; the
worker-loop tests use it to drive a worker without a fork server. Production actors
always run steps in the child: nothing under ``hypermedia/`` can choose this.
"""

from __future__ import annotations

import importlib
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypermedia.config import Settings
from hypermedia.sandbox.limits import DEFAULT_MAX_OUTPUT_BYTES, DEFAULT_MAX_PROCESSES
from hypermedia.sandbox.outcome import ChildFailed, validate_outputs
from pipelines.registry import Output, PipelineError
from pipelines.registry import get as get_step


@dataclass(frozen=True, slots=True)
class InProcessResult:
    outputs: list[Output]
    duration_ms: int
    peak_memory_mb: float | None = None  # not measurable per job in a shared process


class InProcessExecutor:
    """Steps called directly (see the module docstring: benchmark only)."""

    def __init__(self, work_root: Path, preload: Sequence[str] = ("pipelines.registry",)) -> None:
        for module in preload:
            importlib.import_module(module)
        self._jobs_root = Path(work_root).resolve() / "jobs"
        self._jobs_root.mkdir(parents=True, exist_ok=True, mode=0o700)

    def workdir(self, job_id: str) -> Path:
        return self._jobs_root / job_id

    def prepare(self, job_id: str) -> Path:
        workdir = self.workdir(job_id)
        (workdir / "input").mkdir(parents=True, exist_ok=True, mode=0o700)
        return workdir

    def run(
        self,
        job_id: str,
        operation: str,
        input_path: Path,
        params: Mapping[str, Any],
        *,
        timeout_seconds: float,
        memory_limit_mb: int,
        max_processes: int = DEFAULT_MAX_PROCESSES,  # limits are not enforced in process
        max_output_bytes: int = 0,
        on_progress: Callable[[Any], None] | None = None,  # not passed on: see below
    ) -> InProcessResult:
        # A step's progress reports go to one sink per process (pipelines.progress), and
        # here jobs run in threads of one process: they are not passed on.
        workdir = self.workdir(job_id)
        started = time.monotonic()
        try:
            step = get_step(operation)
            outputs = step(input_path, params, workdir)
        except PipelineError as exc:
            raise ChildFailed(exc.code, exc.message, retryable=exc.retryable) from exc
        except Exception as exc:
            raise ChildFailed(
                "pipeline_crashed", f"{type(exc).__name__}: {exc}", retryable=False
            ) from exc
        raw = [
            {"output_type": o.output_type, "content_type": o.content_type, "path": str(o.path)}
            for o in outputs
        ]
        checked = validate_outputs(raw, workdir, DEFAULT_MAX_OUTPUT_BYTES) if raw else []
        return InProcessResult(checked, int((time.monotonic() - started) * 1000))

    def cancel(self, job_id: str) -> bool:
        return False  # a step in this process cannot be killed

    def child_pid(self, job_id: str) -> int | None:
        return None

    def cleanup(self, job_id: str) -> None:
        shutil.rmtree(self.workdir(job_id), ignore_errors=True)

    def close(self) -> None:
        """Nothing to stop."""


def in_process_actor() -> Any:
    """A pipeline actor class whose steps run in the actor (for
    :attr:`~hypermedia.worker.supervisor.Supervisor.actor_class`). It imports ``ray``:
    call it once the cluster's auth environment is set."""
    import ray

    from hypermedia.worker.actor import PipelineService

    class InProcessPipelineService(PipelineService):
        def make_executor(
            self, work_root: Path, preload: tuple[str, ...], cfg: Settings
        ) -> InProcessExecutor:
            return InProcessExecutor(work_root, preload)

    return ray.remote(InProcessPipelineService)
