"""What each HTTP request of a job's path costs the API server, in CPU.

    python -m bench.api_requests                      # 300 of each kind
    python -m bench.api_requests --requests 1000 --kinds upload,submit
    python -m bench.api_requests --socket listening    # served as the local stack serves

One API server (``bench.api_server``: uvicorn, no access log) on the embedded
default stack (SQLite record in a temporary data dir, a private Redis, local
storage with signed blob URLs), and a client in this process sending, kind by kind,
the requests a thumbnail job makes of the API:

* ``upload``: ``PUT /objects`` of a photo-sized JPEG (made here, ~300 KB): the body
  streamed into storage and fsynced, the upload inspection child, the object's row;
* ``submit``: ``POST /process`` of one ``thumbnail`` on an uploaded object;
* ``download``: ``GET`` of an original through a signed blob URL (a worker's input);
* ``output``: ``PUT`` of a 12 KB output through a signed blob URL (a worker's output).

For each kind: the server's CPU per request (its own and its child processes', the
upload inspection server and its children among them, also apart: their ``/proc``
times before and after), the
wall time per request and the client's CPU. A table, and JSON in ``bench/results/``
(``--json`` to choose).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from PIL import Image
from rich.console import Console
from rich.table import Table

from bench import hm
from bench.harness import redis_url, run_metadata, start_redis
from hypermedia import accounts
from hypermedia.config import load_settings
from hypermedia.db.engine import transaction
from hypermedia.embedded import free_port
from hypermedia.stack import Stack
from hypermedia.storage.base import derived_key, original_key

KINDS = ("upload", "submit", "download", "output")
P = "/v1/hypermedia"
ROOT = Path(__file__).resolve().parent.parent
WARMUP = 5


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="timed requests per kind")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"a subset of {KINDS}")
    parser.add_argument("--json", type=Path, help="where to write results")
    parser.add_argument(
        "--socket",
        choices=("bind", "listening"),
        default="bind",
        help="bind: uvicorn binds the port (hypermedia serve); listening: it serves a "
        "socket already listening (the local stack of hypermedia run / up)",
    )
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(kinds) - set(KINDS)
    if unknown or args.requests < 1:
        parser.error(f"unknown kinds {sorted(unknown)}" if unknown else "--requests must be >= 1")
    console = Console()
    with contextlib.ExitStack() as cleanup:
        rows = _run(args.requests, kinds, cleanup, console, args.socket)
    table = Table(title=f"API server CPU per request, {args.requests} of each kind ({args.socket})")
    for name in ("kind", "server CPU ms", "of it, children", "wall ms", "client CPU ms"):
        table.add_column(name, justify="left" if name == "kind" else "right")
    for row in rows:
        table.add_row(
            row["kind"],
            f"{row['server_cpu_ms']:.2f}",
            f"{row['server_children_cpu_ms']:.2f}",
            f"{row['wall_ms']:.2f}",
            f"{row['client_cpu_ms']:.2f}",
        )
    console.print(table)
    path = args.json or ROOT / "bench" / "results" / (
        f"api_requests-{time.strftime('%Y%m%d-%H%M%S')}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = run_metadata(
        {"requests": args.requests, "socket": args.socket, "loadavg_end": list(os.getloadavg())},
        ["fastapi", "starlette", "uvicorn", "httpx", "sqlalchemy"],
    )
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    console.print(f"results: {path}")
    return 0


def _run(
    n: int, kinds: list[str], cleanup: contextlib.ExitStack, console: Console, socket: str
) -> list[dict[str, Any]]:
    tmp = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="hm-bench-api-")))
    redis = start_redis(tmp / "redis", cleanup)
    port = free_port()
    settings = load_settings(
        data_dir=tmp / "data",
        redis_url=redis_url(redis, 0),
        redis_prefix="hmapi",
        api_url=f"http://127.0.0.1:{port}",  # the signed blob URLs point at the server
        user_uploads_per_minute=10**9,
    )
    stack = Stack.open(settings, auto_migrate=True)  # migrates; signs URLs as the server
    cleanup.callback(stack.close)
    with transaction(stack.engine) as conn:
        user = accounts.create_user(
            conn, "bench", time.time(), credits_millicredits=10**13, grants=accounts.UNLIMITED
        )
    base, server = cleanup.enter_context(
        hm.api_server_process(settings, tmp / "api-server.log", port=port, socket=socket)
    )
    client = cleanup.enter_context(httpx.Client(base_url=base, timeout=60))
    photo = _photo()
    headers = {"Authorization": f"Bearer {user.api_key}"}
    uploaded: list[str] = []

    def upload(_i: int) -> None:
        answer = client.put(
            f"{P}/objects", params={"filename": "photo.jpg"}, content=photo, headers=headers
        )
        _expect(answer, 201)
        uploaded.append(answer.json()["object_id"])

    def submit(i: int) -> None:
        body = {"object_id": uploaded[i % len(uploaded)], "operations": ["thumbnail"]}
        _expect(client.post(f"{P}/process", json=body, headers=headers), 202)

    def download(i: int) -> None:
        key = original_key(user.pool_id, uploaded[i % len(uploaded)])
        answer = client.get(stack.storage.presign_get(key, 600))
        _expect(answer, 200)
        assert len(answer.content) == len(photo)

    output = photo[:12_000]

    def put_output(i: int) -> None:
        key = derived_key(user.pool_id, uploaded[i % len(uploaded)], 1, "thumbnail.webp")
        url = stack.storage.presign_put(key, 600, "image/webp")
        answer = client.put(url, content=output, headers={"Content-Type": "image/webp"})
        if answer.status_code not in (200, 201, 204):
            _expect(answer, 201)

    calls: dict[str, Callable[[int], None]] = {
        "upload": upload,
        "submit": submit,
        "download": download,
        "output": put_output,
    }
    if "upload" not in kinds:
        for i in range(WARMUP):  # the other kinds need objects
            upload(i)
    rows = []
    for kind in kinds:
        call = calls[kind]
        for i in range(WARMUP):
            call(i)
        server_before, wall_before, client_before = (
            _cpu(server.pid),
            time.perf_counter(),
            (time.process_time()),
        )
        for i in range(n):
            call(i)
        own_after, children_after = _cpu(server.pid)
        own, children = own_after - server_before[0], children_after - server_before[1]
        wall = time.perf_counter() - wall_before
        client_cpu = time.process_time() - client_before
        rows.append(
            {
                "kind": kind,
                "requests": n,
                "server_cpu_ms": round((own + children) / n * 1000, 3),
                "server_children_cpu_ms": round(children / n * 1000, 3),
                "wall_ms": round(wall / n * 1000, 3),
                "client_cpu_ms": round(client_cpu / n * 1000, 3),
            }
        )
        console.log(f"{kind}: {rows[-1]['server_cpu_ms']:.2f} ms of server CPU a request")
    return rows


def _photo() -> bytes:
    """A photo-sized JPEG (noise: it does not compress away)."""
    out = io.BytesIO()
    Image.effect_noise((800, 600), 60).convert("RGB").save(out, "JPEG", quality=85)
    return out.getvalue()


def _cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of ``pid`` itself, and of every process under it (live ones' own
    times, and what the reaped ones left in their parents'; children of any thread)."""
    own = ticks = 0
    pending = [pid]
    while pending:
        current = pending.pop()
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            times = [int(f) for f in fields[11:15]]  # utime stime cutime cstime
            if current == pid:
                own = times[0] + times[1]
            ticks += sum(times)
            for task in Path(f"/proc/{current}/task").iterdir():
                pending += [int(c) for c in (task / "children").read_text().split()]
    hz = os.sysconf("SC_CLK_TCK")
    return own / hz, (ticks - own) / hz


def _expect(answer: httpx.Response, status: int) -> None:
    if answer.status_code != status:
        raise RuntimeError(f"{answer.request.method} {answer.request.url.path}: "
                           f"{answer.status_code} {answer.text[:300]}")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
