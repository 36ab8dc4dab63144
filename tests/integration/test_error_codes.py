"""Every error code the README lists, produced on the real path by a generated input.

Refusals at submit (README: "Codes"): the file is uploaded over HTTP to the API, then
submitted; the answer is 422 (413 for ``input_too_large``) with the code, and nothing
is left behind. Failures in the worker (README: "Those jobs fail in the worker"): the
file is uploaded and submitted the same way, then claimed, downloaded through its
presigned URL and run in the sandbox (fork server, rlimits, namespaces) by a worker per
queue, exactly as a pipeline actor does it, minus Ray; the job ends ``failed`` with the
code. The limits are the shipped profiles' (``etc/profiles.toml``) except where a case
says otherwise (``OVERRIDES``: a smaller cap so the case is quick). The sandbox's own
limits are reached by the test steps (``tests/pipelines_for_tests.py``): a CPU spin, a
sleep, a fork bomb, a segfault.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from hypermedia import tls
from hypermedia.config import load_settings
from hypermedia.db.engine import make_engine
from hypermedia.embedded import listening_socket
from hypermedia.stack import Stack
from hypermedia.storage.grants import StorageGrants
from hypermedia.worker.execute import JobExecution
from hypermedia.worker.worker import Worker
from tests import error_inputs as make
from tests import ray_support, support
from tests.api_support import add_user, bearer
from tests.pipelines_for_tests import PRELOAD
from tests.ray_support import api_server

P = "/v1/hypermedia"
QUEUES = ("images", "documents", "media", "bulk")
WORKER_DEADLINE = 300.0  # seconds for every worker case together

# Where a case needs a smaller limit than the shipped profile: profile -> key -> value.
OVERRIDES: dict[str, dict[str, str]] = {
    "resize": {"max_input_bytes": "4096"},  # input_too_large without a 100 MB upload
    "convert": {"max_output_bytes": "65536"},  # output_limit from a 200x200 noise PNG
    "pdf_preview": {"memory_limit_mb": "512"},  # memory_limit from a 100 MiB path
    # The CPU limit must come before the wall clock (1.5 x the timeout), on a machine
    # where other sessions may leave the job (a session of its own: the kernel shares
    # CPU between sessions) a small part of a core: the spin lowers its own soft
    # RLIMIT_CPU to 1 s (see tests/pipelines_for_tests.py), and the kernel's SIGXCPU is
    # what the sandbox reads either way.
    "test.spin": {
        "timeout_seconds": "30",
        "params": "{ needs_input = false, cpu_seconds = 1 }",
    },
    "test.sleep": {
        "timeout_seconds": "1",
        "max_attempts": "1",  # a timeout is retryable: one attempt, then failed
        "params": "{ needs_input = false }",
    },
}
EXTRA_PROFILES = """
[profiles."test.crash"]
queue = "bulk"
version = 1
base_cost = 0.0
cost_per_mb = 0.0
timeout_seconds = 30
memory_limit_mb = 512
max_input_bytes = 1024
max_attempts = 1
default_priority = 5
params = { needs_input = false }
"""


@dataclass(frozen=True)
class Case:
    operation: str
    data: Callable[[Path], bytes] | None  # None: the operation reads no input
    params: dict[str, Any] | None = None
    status: int = 422


def _static(maker: Callable[[], bytes]) -> Callable[[Path], bytes]:
    return lambda _directory: maker()


SUBMIT_CASES: dict[str, Case] = {
    "input_type_mismatch": Case("pdf_preview", _static(make.png)),
    "unsupported_format": Case("thumbnail", _static(make.svg)),
    "macro_document": Case("docx_to_pdf", _static(make.docx_with_macros)),
    "encrypted_document": Case("docx_to_pdf", _static(make.docx_with_encrypted_entry)),
    "zip_bomb": Case("docx_to_pdf", _static(make.docx_bomb)),
    "path_traversal": Case("docx_to_pdf", _static(make.docx_with_traversal)),
    "unsafe_xml": Case("docx_to_pdf", _static(make.docx_with_dtd)),
    "polyglot_file": Case("thumbnail", _static(make.png_with_zip)),
    "invalid_input": Case("thumbnail", _static(lambda: b"")),
    "pixel_limit": Case("thumbnail", _static(lambda: make.png_declaring(50_000, 50_000))),
    "page_limit": Case("docx_to_pdf", _static(lambda: make.docx(pages=5000))),
    "duration_limit": Case("transcode_audio", _static(lambda: make.flac_declaring(5 * 3600))),
    "input_too_large": Case("resize", _static(lambda: make.noise_png(64, 64)), status=413),
}

WORKER_CASES: dict[str, Case] = {
    "invalid_input": Case("thumbnail", _static(make.jpeg_with_broken_table)),
    "no_streams": Case("transcode_audio", make.m4a_without_sound),
    "unsupported_format": Case("thumbnail", _static(make.tiff_old_jpeg)),
    "pixel_limit": Case("pdf_preview", _static(lambda: make.one_page_pdf(b"0 0 10 14400"))),
    "page_limit": Case("extract_text", _static(lambda: make.pdf_with_hidden_page_tree(2001))),
    "duration_limit": Case("transcode_audio", _static(lambda: make.aiff_declaring(200_000_000))),
    "memory_limit": Case("pdf_preview", _static(lambda: make.pdf_path_bomb(100))),
    "cpu_limit": Case("test.spin", None),
    "timeout": Case("test.sleep", None, {"seconds": 30}),
    "process_limit": Case("test.fork_bomb", None),
    "output_limit": Case("convert", _static(lambda: make.noise_png(200, 200))),
    "pipeline_crashed": Case("test.crash", None, {"how": "segv"}),
}


def _readme_codes(heading: str) -> set[str]:
    """The codes of the README table that follows ``heading``."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    after = text[text.index(heading) :]
    table = after[after.index("| code |") :].split("\n\n", 1)[0]
    codes: set[str] = set()
    for line in table.splitlines()[2:]:
        first = line.split("|")[1]
        codes.update(re.findall(r"`([a-z_]+)`", first))
    return codes


def test_the_cases_are_the_readmes_codes():
    assert set(SUBMIT_CASES) == _readme_codes("A refusal answers **422**")
    assert set(WORKER_CASES) == _readme_codes("Those jobs fail in the worker")


# -- the stack: API, storage, a worker per queue ---------------------------------------


def _profiles(directory: Path) -> Path:
    path = ray_support.test_profiles(directory)
    text = path.read_text()
    for profile, values in OVERRIDES.items():
        header = f'[profiles."{profile}"]\n' if "." in profile else f"[profiles.{profile}]\n"
        start = text.index(header) + len(header)
        end = text.find("\n[", start)
        end = len(text) if end < 0 else end
        section = text[start:end]
        for key, value in values.items():
            line = re.compile(rf"^{re.escape(key)} = .*$", re.MULTILINE)
            if line.search(section):
                section = line.sub(f"{key} = {value}", section, count=1)
            else:
                section = f"{key} = {value}\n" + section
        text = text[:start] + section + text[end:]
    path.write_text(text + EXTRA_PROFILES)
    return path


@dataclass
class World:
    stack: Stack
    base_url: str
    key: dict[str, str]
    directory: Path

    def upload(self, data: bytes) -> dict[str, Any]:
        response = httpx.put(
            f"{self.base_url}{P}/objects",
            params={"filename": "input.bin"},
            content=data,
            headers={**self.key, "Content-Type": "application/octet-stream"},
            timeout=60,
            verify=tls.client_context(),
        )
        assert response.status_code == 201, response.text
        body: dict[str, Any] = response.json()
        return body

    def submit(self, case: Case) -> httpx.Response:
        body: dict[str, Any] = {"operations": [case.operation]}
        if case.data is not None:
            body["object_id"] = self.upload(case.data(self.directory))["object_id"]
        else:
            body["object_id"] = self.upload(b"-")["object_id"]
        if case.params:
            body["params"] = {case.operation: case.params}
        return httpx.post(
            f"{self.base_url}{P}/process",
            json=body,
            headers=self.key,
            timeout=60,
            verify=tls.client_context(),
        )

    def job(self, job_id: str) -> dict[str, Any]:
        response = httpx.get(
            f"{self.base_url}{P}/jobs/{job_id}",
            headers=self.key,
            timeout=30,
            verify=tls.client_context(),
        )
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body


@pytest.fixture(scope="module")
def world(
    pg_server: support.PostgresServer, pg_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    directory = tmp_path_factory.mktemp("error-codes")
    name = support.unique_name()
    database_url = pg_server.create_database(name, template=support.database_name(pg_url))
    prefix = support.unique_redis_prefix()
    sock = listening_socket()
    settings = load_settings(
        data_dir=directory,
        database_url=database_url,
        redis_url=support.redis_server_url(),
        redis_prefix=prefix,
        api_url=f"http://127.0.0.1:{sock.getsockname()[1]}",
        profiles_path=_profiles(directory),
    )
    engine = make_engine(database_url)
    stack = Stack.open(settings, engine=engine, auto_migrate=True)
    from hypermedia.sandbox.executor import ChildExecutor

    workers: list[Worker] = []
    executors: list[ChildExecutor] = []
    try:
        with api_server(stack, sock) as base_url:
            grants = StorageGrants(stack.engine, stack.storage, 900, stack.clock)
            for queue in QUEUES:
                worker_id = f"codes-{queue}"
                work_root = directory / "work" / worker_id
                executor = ChildExecutor(work_root, preload=PRELOAD, hidden_paths=(directory,))
                executors.append(executor)
                execution = JobExecution(
                    stack.dispatcher, stack.catalog, grants, executor, worker_id
                )
                worker = Worker(
                    worker_id=worker_id,
                    queue=queue,
                    concurrency=1,
                    engine=stack.engine,
                    dispatcher=stack.dispatcher,
                    execution=execution,
                    work_root=str(work_root),
                    clock=stack.clock,
                )
                worker.start()
                workers.append(worker)
            user = add_user(stack, "codes", credits=1_000_000)
            yield World(stack, base_url, bearer(user), directory)
    finally:
        for worker in workers:
            worker.stop()
        for executor in executors:  # the caller's (as a pipeline actor closes its own)
            executor.close()
        stack.close()
        engine.dispose()
        pg_server.drop_database(name)
        client = redis.Redis.from_url(support.redis_server_url())
        support.delete_keys(client, prefix)
        client.close()
        shutil.rmtree(directory / "work", ignore_errors=True)


# -- refused at submit -----------------------------------------------------------------


@pytest.mark.parametrize("code", sorted(SUBMIT_CASES))
def test_refused_at_submit(world: World, code: str):
    case = SUBMIT_CASES[code]
    response = world.submit(case)
    assert response.status_code == case.status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    assert error["message"]


# -- failed in the worker ----------------------------------------------------------------


@pytest.fixture(scope="module")
def worker_outcomes(world: World) -> dict[str, dict[str, Any]]:
    """Every worker case submitted at once, then followed until each job has ended."""
    return _run(world, WORKER_CASES)


def _run(world: World, cases: dict[str, Case]) -> dict[str, dict[str, Any]]:
    job_ids: dict[str, str] = {}
    for code, case in cases.items():
        response = world.submit(case)
        assert response.status_code == 202, (code, response.text)
        job_ids[code] = response.json()["job_ids"][0]
    ended: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + WORKER_DEADLINE
    while len(ended) < len(job_ids):
        for code, job_id in job_ids.items():
            if code not in ended:
                view = world.job(job_id)
                if view["status"] in ("completed", "failed", "cancelled"):
                    ended[code] = view
        if time.monotonic() > deadline:
            missing = sorted(set(job_ids) - set(ended))
            raise AssertionError(f"not ended within {WORKER_DEADLINE:g} s: {missing}")
        time.sleep(0.2)
    return ended


@pytest.mark.parametrize("code", sorted(WORKER_CASES))
def test_failed_in_the_worker(worker_outcomes: dict[str, dict[str, Any]], code: str):
    view = worker_outcomes[code]
    assert (view["status"], view["error_code"]) == ("failed", code), view["error_message"]
    assert view["error_message"]
