"""Every generated file of ``hostile/`` and ``images/`` (tests/generated), and every file
of the shared corpus's (the corpus tier), through the real worker path: uploaded over
HTTP under its own (hostile) name, submitted for the operation that fits its detected
kind, inspected at submit, then downloaded, sandboxed and processed by pipeline actors
on a real Ray cluster. Each row ends as its MANIFEST ``expected`` says:

- ``reject:<reason>``: refused at submit, or failed at the worker, with the code that
  names the reason (``REJECT_CODES``);
- ``tolerate:<reason>``: completed, or failed with a stable code, within the profile's
  wall clock;
- ``neutralize:<what>``: completed (or refused as a format the platform does not
  process) and nothing fetched: a canary listener on loopback, which extra copies of
  the external-reference documents point at (generated for it, or derived from the
  corpus's), receives no connection;
  metadata carrying code does not reach the output;
- ``sanitize:filename``: completed, and the name appears in no path on disk and in no
  output key;
- ``valid``: completed, or ``unsupported_format`` for a format the README does not
  list as supported.

A table of file -> expected -> outcome is printed. Then the attacks a job can mount on
its own (a memory bomb, a CPU spin, a fork bomb, a disk flood, a connection to
loopback) each fail with their limit's code while the workers keep serving. After all
of it: no process runs under a job uid, no job workdir is left, and no worker holds
more descriptors than it did after its first jobs.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import ray
from rich.console import Console
from rich.table import Table

from hypermedia.errors import HypermediaError
from hypermedia.ingest.client import HypermediaClient
from hypermedia.ingest.schemas import JobResponse
from tests.corpus_support import Row, allowed, corpus, manifest_rows, operation_for
from tests.factories import make_user
from tests.generated import Generated, documents, packages
from tests.ray_support import RayStack, ray_stack

# The queues of the operations the files go to (corpus_support.operation_for: images,
# documents, media; no bulk: an actor there only started and beat).
POOLS = {"images": 1, "documents": 1, "media": 1}
TERMINAL = ("completed", "failed", "cancelled")
# Codes a worker may fail a job with that say "this input is not acceptable".
DECODE = {"invalid_input"}
LIMIT = {"pixel_limit", "page_limit", "duration_limit", "memory_limit", "cpu_limit", "timeout"}
# reject:<reason> -> the codes that name it, at submit or at the worker.
REJECT_CODES: dict[str, set[str]] = {
    # A media file cut before its first track, or with a header and no track: no_streams.
    "malformed": DECODE | {"unsupported_format", "no_streams"},
    "truncated": DECODE | {"unsupported_format", "no_streams"},
    "no-image-data": DECODE,
    "no-dimensions": DECODE | {"unsupported_format"},
    "no-samples": DECODE | {"no_streams"},
    "no-streams": DECODE | {"no_streams"},
    "decompression-bomb": LIMIT | {"output_limit"},
    # POI's shared-strings bomb: refused at submit (its cells' text, counted) or stopped.
    "expansion-bomb": LIMIT | {"output_limit", "zip_bomb"},
    "pixel-flood": {"pixel_limit"},
    "cpu-dos": LIMIT | {"unsupported_format"},
    # 'GIF89a1' and PHP: a GIF signature and no image: refused as a polyglot or undecodable.
    "polyglot": {"polyglot_file"} | DECODE,
}
# Codes that are never an acceptable end: a bug, or an infrastructure failure.
UNSTABLE = {"pipeline_crashed", "sandbox_unavailable", "worker_lost", "internal_error"}
PHP = b"<?php"


class Canary:
    """TCP listeners on loopback that count every connection made to them."""

    def __init__(self) -> None:
        self.connections: list[tuple[int, bytes]] = []
        self._servers: list[socket.socket] = []
        self._lock = threading.Lock()
        self.port = self._listen(0)
        with contextlib.suppress(OSError):  # http://localhost/... in the corpus: port 80
            self._listen(80)

    def _listen(self, port: int) -> int:
        server = socket.create_server(("127.0.0.1", port))
        server.settimeout(0.2)
        self._servers.append(server)
        # Its port read here: a listener closed before its thread first ran made the
        # thread's getsockname() raise (EBADF, a warning in whichever test ran next).
        bound = int(server.getsockname()[1])
        threading.Thread(target=self._accept, args=(server, bound), daemon=True).start()
        return bound

    def _accept(self, server: socket.socket, port: int) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(1)
                try:
                    data = conn.recv(200)
                except OSError:
                    data = b""
                with self._lock:
                    self.connections.append((port, data))

    def close(self) -> None:
        for server in self._servers:
            server.close()


@dataclass
class Case:
    row: Row
    path: Path  # the file uploaded (the manifest's file, or a copy made for the canary)
    operation: str = ""
    detected: str = ""
    job_id: str | None = None
    refused: str | None = None  # code at submit
    message: str = ""
    view: JobResponse | None = None

    @property
    def name(self) -> str:
        return Path(self.row.path).name

    @property
    def outcome(self) -> str:
        if self.refused is not None:
            return self.refused
        assert self.view is not None
        if self.view.status == "completed":
            return "completed"
        return self.view.error_code or self.view.status


def _rewrite_zip(source: Path, target: Path, old: bytes, new: bytes) -> None:
    """A copy of an OOXML package with ``old`` replaced by ``new`` in every part."""
    with zipfile.ZipFile(source) as zin:
        parts = [(info.filename, zin.read(info)) for info in zin.infolist()]
    assert any(old in data for _name, data in parts), (source, old)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zout:
        for name, data in parts:
            zout.writestr(name, data.replace(old, new))


def canary_case(path: Path) -> Case:
    return Case(Row(f"derived/{path.name}", "", "neutralize:external-ref"), path)


def generated_canary_documents(directory: Path, port: int) -> list[Case]:
    """The generator's external-reference documents, pointed at the canary."""
    url = f"http://127.0.0.1:{port}"
    made = {
        "canary-picture.docx": packages.external_picture_docx(f"{url}/picture.png"),
        "canary-template.docx": packages.attached_template_docx(f"{url}/template.dotx"),
        "canary-linked.fodt": documents.linked_fodt(f"{url}/giraffe.png").encode(),
    }
    for name, data in made.items():
        (directory / name).write_bytes(data)
    return [canary_case(directory / name) for name in made]


def corpus_canary_documents(directory: Path, port: int) -> list[Case]:
    """Copies of the corpus's external-reference documents whose links point at the
    canary (the originals point at example.com, or a local file, or a relative path)."""
    url = f"http://127.0.0.1:{port}".encode()
    originals = corpus() / "hostile"
    cases = []
    for name, old, new in [
        (
            "tika-testAttachedTemplate.docx",
            b"http://example.com/templates/malicious.dotx",
            url + b"/malicious.dotx",
        ),
        ("mammoth-external-picture.docx", b'Target="tiny-picture.png"', b'Target="%s/p.png"' % url),
    ]:
        target = directory / f"canary-{name}"
        _rewrite_zip(originals / name, target, old, new)
        cases.append(canary_case(target))
    fodt = originals / "gotenberg-libreoffice-linked-external.fodt"
    target = directory / f"canary-{fodt.name}"
    text = fodt.read_bytes()
    old = b"file:///usr/lib/libreoffice/share/gallery/backgrounds/giraffe.png"
    assert old in text
    target.write_bytes(text.replace(old, url + b"/giraffe.png"))
    cases.append(canary_case(target))
    return cases


def problem(case: Case, rs: RayStack) -> str | None:
    """What is wrong with the case's outcome, or None."""
    verdict, _, reason = case.row.expected.partition(":")
    outcome = case.outcome
    if outcome in UNSTABLE:
        return f"unstable outcome {outcome}: {case.message}"
    if case.refused is not None:
        want = allowed(case.row)
        if want is not None and outcome not in want:
            return f"refused at submit with {outcome}, expected one of {sorted(want)}"
        named = REJECT_CODES.get(reason) if verdict == "reject" else None
        if want is None and named is not None and outcome not in named:
            return f"refused with {outcome}, expected one of {sorted(named)}"
        return None
    view = case.view
    assert view is not None
    timeout = rs.stack.catalog.get(case.operation).timeout_seconds
    for attempt in view.attempts:
        if attempt.duration_ms is not None and attempt.duration_ms > timeout * 1.5 * 1000 + 5000:
            return f"attempt ran {attempt.duration_ms} ms, over the wall clock"
    if verdict == "reject":
        codes = REJECT_CODES.get(reason) or allowed(case.row) or set()
        if outcome not in codes:
            return f"{outcome}: {view.error_message!r}, expected one of {sorted(codes)}"
    elif verdict == "tolerate":
        if outcome != "completed" and outcome not in DECODE | LIMIT | {"output_limit"}:
            return f"{outcome}: {view.error_message!r} is not a stable refusal"
    elif verdict in ("valid", "neutralize"):
        if outcome not in ("completed", "unsupported_format"):
            return f"{outcome}: {view.error_message!r}"
    elif verdict == "sanitize" and outcome != "completed":
        return f"{outcome}: {view.error_message!r}"
    return None


def read_output(rs: RayStack, key: str) -> bytes:
    return b"".join(rs.stack.storage.read(key))


def submit(client: HypermediaClient, case: Case) -> None:
    obj = client.upload(case.path)  # under the file's own name: the hostile part
    case.detected = obj.detected_kind or ""
    case.operation = operation_for(case.row, case.detected)
    try:
        case.job_id = client.process(obj.object_id, [case.operation]).job_ids[0]
    except HypermediaError as exc:
        case.refused, case.message = exc.code, exc.message


def wait_all(client: HypermediaClient, cases: list[Case], timeout: float) -> None:
    pending = [c for c in cases if c.job_id is not None]
    deadline = time.monotonic() + timeout
    while pending:
        assert time.monotonic() < deadline, [
            (c.name, c.view.status if c.view else None) for c in pending
        ]
        still = []
        for case in pending:
            assert case.job_id is not None
            case.view = client.job(case.job_id)
            if case.view.status in TERMINAL:
                case.message = case.view.error_message or ""
            else:
                still.append(case)
        pending = still
        if pending:
            time.sleep(1)


def healths(rs: RayStack) -> dict[str, dict[str, Any]]:
    members = rs.supervisor.actors()
    return {m.worker_id: ray.get(m.actor.health.remote(), timeout=30) for m in members}


@contextmanager
def canary_listener() -> Iterator[Canary]:
    canary = Canary()
    try:
        yield canary
    finally:
        canary.close()


def data_paths(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*")]


@pytest.mark.timeout(600)
def test_generated_hostile_files_and_images_through_the_workers(
    pg_engine, settings, tmp_path, generated: Generated
):
    rows = generated.rows(["hostile", "images"])
    through_the_workers(
        rows,
        generated.root,
        generated_canary_documents,
        "php-in-metadata.jpg",
        pg_engine,
        settings,
        tmp_path,
    )


@pytest.mark.corpus
@pytest.mark.timeout(600)
def test_hostile_and_image_corpus_through_the_workers(pg_engine, settings, tmp_path):
    rows = manifest_rows(("hostile", "images"))
    assert len(rows) >= 190
    through_the_workers(
        rows,
        corpus(),
        corpus_canary_documents,
        "fuzzdb-POC_phpinfo-metadata.jpg",
        pg_engine,
        settings,
        tmp_path,
    )


def through_the_workers(
    rows: list[Row],
    root: Path,
    canary_documents: Callable[[Path, int], list[Case]],
    php_file: str,
    pg_engine,
    settings,
    tmp_path: Path,
) -> None:
    """``rows`` (files under ``root``) and the canary's documents through the workers;
    ``php_file`` is the name of the JPEG with PHP in its metadata."""
    with canary_listener() as canary, ray_stack(settings, pg_engine, tmp_path, POOLS) as rs:
        person = make_user(rs.stack)
        cases = [Case(row, root / row.path) for row in rows]
        cases += canary_documents(tmp_path, canary.port)
        assert rs.settings.api_url is not None
        with HypermediaClient(rs.settings.api_url, person.api_key, timeout=60) as client:
            # A first round warms every worker up (pools, clients, fork servers): the
            # descriptor baseline is taken after it.
            warm = [c for c in cases if c.row.expected == "valid"][:3]
            for case in warm:
                submit(client, case)
            wait_all(client, warm, 300)
            baseline = healths(rs)
            for case in cases:
                if any(case is w for w in warm):
                    continue
                submit(client, case)
            wait_all(client, cases, 1500)
        after = healths(rs)

        table = Table("file", "expected", "detected", "operation", "outcome", "where", "ms")
        problems = []
        for case in cases:
            found = problem(case, rs)
            if found:
                problems.append(f"{case.row.path}: {found}")
            where = "submit" if case.refused else "worker"
            detail = (
                case.outcome if case.outcome == "completed" else f"{case.outcome}: {case.message}"
            )
            ran = [a.duration_ms or 0 for a in case.view.attempts] if case.view else []
            table.add_row(
                case.name[:60],
                case.row.expected,
                case.detected,
                case.operation,
                detail[:70],
                where,
                "+".join(map(str, ran)),
            )
        Console(width=220).print(table)
        print(Counter(c.outcome for c in cases))
        print("canary connections:", canary.connections)
        assert problems == [], "\n".join(problems)

        # neutralize: nothing fetched, nothing of the hidden payload kept.
        assert canary.connections == []
        metadata = next(c for c in cases if c.name == php_file)
        assert metadata.view is not None and metadata.view.status == "completed"
        (output,) = metadata.view.outputs
        assert PHP not in read_output(rs, output.storage_key)
        assert PHP in metadata.path.read_bytes()

        # sanitize: processed, and the name reached no path and no key.
        names = [c for c in cases if c.row.expected == "sanitize:filename"]
        assert len(names) >= 8 and all(c.outcome == "completed" for c in names)
        on_disk = data_paths(rs.settings.data_dir)
        for case in names:
            stem = Path(case.name).stem
            assert not [p for p in on_disk if stem in p], case.name
            assert case.view is not None
            assert all(stem not in o.storage_key for o in case.view.outputs), case.name

        # The workers hold what they held after their first jobs, and nothing of any job.
        assert set(after) == set(baseline), "a worker was replaced"
        for worker_id, health in after.items():
            print(worker_id, "fds", baseline[worker_id]["open_fds"], "->", health["open_fds"])
            assert health["job_processes"] == [], worker_id
            assert health["workdirs"] == [], worker_id
            assert health["running"] == 0
            # Pools may open a connection or two more under load (a worker's first job
            # may come after the baseline); a descriptor leaked per job would be hundreds.
            assert health["open_fds"] <= baseline[worker_id]["open_fds"] + 10, worker_id


ATTACKS: list[tuple[str, dict[str, Any], set[str]]] = [
    # operation, params, the codes its limit fails it with
    ("test.allocate", {}, {"memory_limit"}),
    ("test.spin", {}, {"cpu_limit", "timeout"}),
    ("test.fork_bomb", {}, {"process_limit"}),
    ("test.flood", {}, {"output_limit"}),
    ("test.flood_files", {}, {"output_limit"}),
]


def test_attacks_stop_at_their_limits_and_the_workers_survive(pg_engine, settings, tmp_path):
    with canary_listener() as canary, ray_stack(settings, pg_engine, tmp_path, {"bulk": 1}) as rs:
        person = make_user(rs.stack)
        assert rs.settings.api_url is not None
        (source := tmp_path / "x.txt").write_text("x")
        with HypermediaClient(rs.settings.api_url, person.api_key, timeout=60) as client:
            object_id = client.upload(source).object_id
            before = healths(rs)
            jobs = {}
            for operation, params, _codes in ATTACKS:
                result = client.process(object_id, [operation], params={operation: params})
                jobs[operation] = result.job_ids[0]
            targets = [["127.0.0.1", canary.port]]
            connect = client.process(
                object_id, ["test.connect"], params={"test.connect": {"targets": targets}}
            ).job_ids[0]
            views = {}
            for operation, job_id in [*jobs.items(), ("test.connect", connect)]:
                views[operation] = client.wait(job_id, timeout=180)
        for operation, _params, codes in ATTACKS:
            view = views[operation]
            print(operation, view.status, view.error_code, view.error_message)
            assert view.status == "failed" and view.error_code in codes, operation
            assert view.attempt_count == 1
        # The network attempt fails inside the job; the job itself completes.
        reached = views["test.connect"]
        assert reached.status == "completed"
        (output,) = reached.outputs
        seen = json.loads(read_output(rs, output.storage_key))
        assert seen["targets"] == {f"127.0.0.1:{canary.port}": "ENETUNREACH"}, seen
        assert canary.connections == []

        after = healths(rs)
        assert set(after) == set(before), "a worker was replaced"
        for health in after.values():
            assert health["job_processes"] == [] and health["workdirs"] == []
        assert sum(s["failed"] for s in rs.supervisor.stats().values()) >= len(ATTACKS)


def test_canary_counts_a_connection(tmp_path):
    """The canary is not blind: a connection from this process is counted."""
    with canary_listener() as canary:
        with socket.create_connection(("127.0.0.1", canary.port), timeout=5) as conn:
            conn.sendall(b"ping")
        deadline = time.monotonic() + 5
        while not canary.connections and time.monotonic() < deadline:
            time.sleep(0.05)
        assert canary.connections and canary.connections[0][1] == b"ping"
