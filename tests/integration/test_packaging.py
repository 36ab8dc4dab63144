"""The wheel: what it carries, what it requires, and what a client-only install can do.

The checkout reads etc/ itself; a non-editable install (a VPS head, the worker image)
finds the shipped defaults under <prefix>/share/hypermedia/etc (pyproject's data-files).
``pip install hypermedia`` is the HTTP client alone (a web tier that only submits jobs);
the platform is the ``server`` extra, each cloud driver's SDK its own extra."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from hypermedia.etc import shipped_etc

REPO = Path(__file__).resolve().parents[2]
#: What the wheel is built from: all that docker/worker.Dockerfile copies into its build stage.
WHEEL_SOURCES = ("pyproject.toml", "README.md", "hypermedia", "pipelines", "autoscaler", "etc")
#: The client's requirements: what `pip install hypermedia` brings.
CLIENT_REQUIREMENTS = {"httpx", "pydantic"}
#: Server-side distributions that must come with an extra only.
SERVER_SIDE = {
    "sqlalchemy",
    "alembic",
    "psycopg",
    "redis",
    "limits",
    "fastapi",
    "uvicorn",
    "pydantic-settings",
    "typer",
    "rich",
    "ray",
    "pyyaml",
    "psutil",
    "boto3",
    "pyvips",
    "pyvips-binary",
    "pillow",
    "pillow-heif",
    "python-magic",
    "olefile",
    "cryptography",
    "pypdfium2",
    "google-cloud-compute",
    "google-cloud-bigquery",
    "grpcio",
    "ionoscloud",
}
#: Their import names, for the subprocesses that must not load them.
SERVER_SIDE_MODULES = {
    "sqlalchemy",
    "alembic",
    "psycopg",
    "redis",
    "limits",
    "fastapi",
    "starlette",
    "uvicorn",
    "pydantic_settings",
    "typer",
    "click",
    "rich",
    "ray",
    "yaml",
    "psutil",
    "boto3",
    "botocore",
    "pyvips",
    "PIL",
    "pillow_heif",
    "magic",
    "olefile",
    "cryptography",
    "pypdfium2",
    "google",
    "grpc",
    "ionoscloud",
    "pipelines",
    "autoscaler",
}

# Answers the client's requests the way the API does (a few routes, canned bodies), then
# prints what the client made of them and which top-level modules the process loaded.
PROBE = r"""
import json, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

seen = []

class Api(BaseHTTPRequestHandler):
    def do_GET(self):
        seen.append([self.path, self.headers.get("Authorization")])
        if self.path == "/healthz":
            self.answer(200, {"status": "ok", "database": True, "redis": False})
        elif self.path == "/v1/hypermedia/credits":
            self.answer(200, {"balance": 12.5, "reserved": 2.5, "available": 10.0})
        else:
            error = {"code": "not_found", "message": "no such job", "details": {"job_id": "j1"}}
            self.answer(404, {"error": error})

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
threading.Thread(target=server.serve_forever, daemon=True).start()

import hypermedia.ingest.client as module
from hypermedia.errors import NotFound

not_found = None
with module.HypermediaClient(f"http://127.0.0.1:{server.server_port}", "hm_key") as client:
    health = client.health()
    credits = client.credits()
    try:
        client.job("j1")
    except NotFound as exc:
        not_found = [exc.message, exc.details]
server.shutdown()
print(json.dumps({
    "health": [health.status, health.database, health.redis],
    "available": credits.available,
    "not_found": not_found,
    "seen": seen,
    "client": module.__file__,
    "loaded": sorted({name.split(".")[0] for name in sys.modules}),
}))
"""

# Run before PROBE: imports resolve to the standard library, the wheel's own hypermedia
# and the distributions its base requirements install (argv[1]); anything else fails to
# import as if it were not installed. The wheel (argv[2]) goes first on sys.path.
BLOCKER = r"""
import importlib.abc, json, sys

ALLOWED = set(json.loads(sys.argv[1]))

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in ALLOWED or top in sys.stdlib_module_names:
            return None
        if top.startswith("_sysconfigdata_"):  # the standard library's, named per platform
            return None
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Blocker())
sys.path.insert(0, sys.argv[2])
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of WHEEL_SOURCES (an in-tree build would share the
    checkout's build/ with any other build running at the same time)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    for name in WHEEL_SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(
                REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            source.mkdir(exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(work), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (found,) = work.glob("hypermedia-*.whl")
    return found


def wheel_metadata(wheel: Path) -> tuple[list[Requirement], set[str]]:
    """The wheel's requirements and its extras."""
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read("hypermedia-0.1.0.dist-info/METADATA").decode()
    message = Parser().parsestr(text)
    return (
        [Requirement(line) for line in message.get_all("Requires-Dist") or []],
        set(message.get_all("Provides-Extra") or []),
    )


def in_extra(requirements: list[Requirement], extra: str) -> set[str]:
    return {
        canonicalize_name(r.name)
        for r in requirements
        if r.marker is not None and r.marker.evaluate({"extra": extra})
    }


def base_requirements(requirements: list[Requirement]) -> set[str]:
    return {canonicalize_name(r.name) for r in requirements if r.marker is None}


@functools.cache
def client_modules(wheel: Path) -> tuple[str, ...]:
    """Top-level import names of what `pip install <wheel>` installs: the base
    requirements and theirs (no extras), as installed in this environment. Once a wheel
    (it reads every installed distribution's file list: ~0.13 CPU-s; asked four times)."""
    requirements, _ = wheel_metadata(wheel)
    pending, dists = list(base_requirements(requirements)), set[str]()
    while pending:
        name = pending.pop()
        if name in dists:
            continue
        dists.add(name)
        for line in metadata.requires(name) or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(canonicalize_name(requirement.name))
    modules = {"hypermedia"}
    for module, owners in metadata.packages_distributions().items():
        if any(canonicalize_name(owner) in dists for owner in owners):
            modules.add(module)
    return tuple(sorted(modules))


def run_blocked(wheel: Path, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    allowed = json.dumps(client_modules(wheel))
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + code, allowed, str(wheel)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,  # not the checkout: its hypermedia/ must not stand in for the wheel's
        check=False,
    )


def check_probe(output: str, installed_from: Path) -> None:
    result = json.loads(output)
    assert result["health"] == ["ok", True, False]
    assert result["available"] == 10.0
    assert result["not_found"] == ["no such job", {"job_id": "j1"}]
    assert result["seen"] == [
        ["/healthz", "Bearer hm_key"],
        ["/v1/hypermedia/credits", "Bearer hm_key"],
        ["/v1/hypermedia/jobs/j1", "Bearer hm_key"],
    ]
    assert Path(result["client"]).is_relative_to(installed_from), result["client"]
    assert not SERVER_SIDE_MODULES & set(result["loaded"]), result["loaded"]


def test_the_checkout_then_the_prefix(tmp_path):
    checkout, prefix = tmp_path / "checkout" / "etc", tmp_path / "prefix" / "etc"
    prefix.mkdir(parents=True)
    (prefix / "profiles.toml").write_text("")
    assert shipped_etc((checkout, prefix)) == prefix  # no checkout etc/: the installed one
    checkout.mkdir(parents=True)
    (checkout / "profiles.toml").write_text("")
    assert shipped_etc((checkout, prefix)) == checkout
    assert shipped_etc() == REPO / "etc"


def test_the_wheel_carries_the_defaults(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    data = "hypermedia-0.1.0.data/data/share/hypermedia/etc"
    for shipped in (
        "profiles.toml",
        "scheduler.json",
        "traces/daily_cycle.csv",
        "prometheus/prometheus.yml",
        "grafana/dashboards/hypermedia_grafana_dashboard.json",
        "grafana/provisioning/datasources/default.yml",
    ):
        assert f"{data}/{shipped}" in names, sorted(n for n in names if ".data/" in n)
    assert "autoscaler/provider.py" in names and "pipelines/registry.py" in names
    assert any(n.startswith("hypermedia/queue/scripts/") and n.endswith(".lua") for n in names)
    # The operator page's template and its chart library, with the library's licence.
    page = "autoscaler/page"
    for part in ("templates/operator.html", "static/uPlot.iife.min.js", "static/uPlot.LICENSE"):
        assert f"{page}/{part}" in names, part
    # The script that starts /docs' Swagger UI (whose files are fastapi-offline's).
    assert "hypermedia/ingest/docs_static/swagger-init.js" in names


def test_the_worker_image_builds_the_same_wheel_with_the_server_extra():
    """The image's build stage copies every file the wheel is built from (a missing
    one fails the build: etc/ for the data files), takes the dependencies of `server`
    and `ocr` (the image serves every queue) from pyproject.toml at the pins, and the
    image gets the venv with them and the project installed from its wheel."""
    dockerfile = (REPO / "docker" / "worker.Dockerfile").read_text()
    build_stage, worker_stage = dockerfile.split(" AS worker")
    copied = set()
    for line in build_stage.splitlines():
        if line.startswith("COPY "):
            copied.update(line.split()[1:-1])
    assert set(WHEEL_SOURCES) <= copied, set(WHEEL_SOURCES) - copied
    for part in ("['dependencies']", "['optional-dependencies']['server']"):
        assert part in build_stage
    assert "['optional-dependencies']['ocr']" in build_stage
    pinned = "--constraint docker/constraints.txt --requirement /src/requirements.txt"
    assert build_stage.count(pinned) == 2  # the wheels, then the venv from them alone
    assert "pip wheel --no-deps --no-build-isolation" in build_stage
    assert "--no-index --no-deps --root /project" in build_stage
    assert "COPY --from=build /opt/hypermedia /opt/hypermedia" in worker_stage
    assert "COPY --from=build /project/ /" in worker_stage


def test_the_base_install_is_the_client_and_the_rest_are_extras(wheel):
    requirements, extras = wheel_metadata(wheel)
    assert base_requirements(requirements) == CLIENT_REQUIREMENTS
    assert extras == {"server", "ocr", "paddle", "aws", "gcp", "ionos", "all", "dev", "bench"}
    server = in_extra(requirements, "server")
    assert {"ray", "sqlalchemy", "fastapi", "typer", "pyvips-binary", "boto3"} <= server
    assert in_extra(requirements, "aws") == {"boto3"}
    assert in_extra(requirements, "gcp") == {"google-cloud-compute", "google-cloud-bigquery"}
    assert in_extra(requirements, "ionos") == {"ionoscloud"}
    assert {"rapidocr", "onnxruntime", "tesserocr", "fpdf2"} <= in_extra(requirements, "ocr")
    (everything,) = [r for r in requirements if r.marker and r.marker.evaluate({"extra": "all"})]
    assert (everything.name, everything.extras) == (
        "hypermedia",
        {"server", "ocr", "aws", "gcp", "ionos"},
    )
    dev = [r for r in requirements if r.marker and r.marker.evaluate({"extra": "dev"})]
    assert any(r.name == "hypermedia" and r.extras == {"all", "paddle"} for r in dev), dev
    assert in_extra(requirements, "paddle") == {"paddleocr", "paddlepaddle"}
    # Every server-side package the platform imports comes with an extra, never the base.
    listed = set().union(*(in_extra(requirements, e) for e in ("server", "gcp", "ionos")))
    assert SERVER_SIDE - {"grpcio"} <= listed, SERVER_SIDE - listed
    with zipfile.ZipFile(wheel) as archive:
        scripts = archive.read("hypermedia-0.1.0.dist-info/entry_points.txt").decode()
    assert "hypermedia = hypermedia.console:main" in scripts


def test_the_client_needs_nothing_server_side(wheel, tmp_path):
    """The wheel's client, where only the base requirements can be imported, talks to
    an HTTP server: requests with the key, answers parsed, an error as its class."""
    allowed = set(client_modules(wheel))
    assert {"httpx", "pydantic", "pydantic_core"} <= allowed
    assert not SERVER_SIDE_MODULES & allowed, SERVER_SIDE_MODULES & allowed
    done = run_blocked(wheel, PROBE, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    check_probe(done.stdout, wheel)


def test_the_command_line_says_which_extra_it_needs(wheel, tmp_path):
    code = "from hypermedia.console import main\nsys.argv = ['hypermedia', '--help']\nmain()\n"
    done = run_blocked(wheel, code, tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "error: the hypermedia command line needs the server extra (typer is not installed):"
        " pip install 'hypermedia[server]'"
    ]


def test_the_command_line_still_raises_for_a_missing_module_of_ours(wheel, tmp_path):
    """A module of the project that is missing is a broken install: its traceback
    shows, not an install hint."""
    code = (
        "sys.modules['hypermedia.cli'] = None\n"
        "from hypermedia.console import main\nsys.argv = ['hypermedia']\nmain()\n"
    )
    done = run_blocked(wheel, code, tmp_path)
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "hypermedia.cli" in done.stderr, done.stderr
    assert "pip install" not in done.stderr


@pytest.mark.timeout(600)
def fresh_venv(path: Path) -> Path:
    """A new venv with nothing in it, not even pip: ``venv``'s own copy of pip (ensurepip)
    cost 4.5 of the ~13 CPU-s of the install test, twice a run. :func:`pip_into` installs."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120
    )
    return path


def pip_into(python: Path) -> list[str]:
    """Our pip, installing into the environment of ``python`` (pip's ``--python``: it runs
    itself with that interpreter, so what it resolves and where it installs are that
    venv's, as a ``pip install`` run there)."""
    return [sys.executable, "-m", "pip", "--python", str(python)]


def test_pip_install_of_the_wheel_without_extras(wheel, tmp_path):
    """A real `pip install <wheel>` into a fresh venv (from the package index): the
    client works there, nothing server-side came along, and the console script says
    what to install."""
    venv = fresh_venv(tmp_path / "venv")
    python, env = venv / "bin" / "python", {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    installed = subprocess.run(
        [*pip_into(python), "install", "-q", str(wheel)],
        capture_output=True,
        text=True,
        timeout=480,
        env=env,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    # The venv's own: not a checkout on PYTHONPATH (its hypermedia would stand in).
    alone = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    names_code = "import importlib.metadata as m; print(*(d.name for d in m.distributions()))"
    listing = subprocess.run(
        [str(python), "-c", names_code],
        capture_output=True,
        text=True,
        timeout=60,
        env=alone,
        check=True,
    )
    names = {canonicalize_name(n) for n in listing.stdout.split()}
    assert names >= {"hypermedia", *CLIENT_REQUIREMENTS}
    assert not SERVER_SIDE & names, SERVER_SIDE & names

    done = subprocess.run(
        [str(python), "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=alone,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    check_probe(done.stdout, venv)

    script = subprocess.run(
        [str(venv / "bin" / "hypermedia"), "submit", "x.jpg"],
        capture_output=True,
        text=True,
        timeout=60,
        env=alone,
        check=False,
    )
    assert script.returncode == 1
    assert re.fullmatch(
        r"error: the hypermedia command line needs the server extra \(\w+ is not installed\):"
        r" pip install 'hypermedia\[server\]'\n",
        script.stderr,
    ), script.stderr


#: A web tier's code with a type error only the client's own types reveal.
TYPED_USER = """\
from hypermedia.ingest.client import HypermediaClient

with HypermediaClient("http://127.0.0.1:8080", "hm_x") as client:
    submitted = client.process("an-object", ["thumbnail"])
    count: int = submitted.job_ids
"""


def test_a_web_tiers_mypy_checks_its_calls_against_the_installed_clients_types(wheel, tmp_path):
    """The wheel is typed (PEP 561's py.typed): mypy, run on code that uses the
    installed client, reads its annotations rather than refusing the import."""
    assert "hypermedia/py.typed" in zipfile.ZipFile(wheel).namelist()
    python = fresh_venv(tmp_path / "venv") / "bin" / "python"
    subprocess.run(
        [*pip_into(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        timeout=300,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    user = tmp_path / "web_tier.py"
    user.write_text(TYPED_USER)
    # Only the venv's site-packages: not the checkout (cwd, PYTHONPATH).
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    mypy = [sys.executable, "-m", "mypy", "--strict", "--no-incremental"]
    checked = subprocess.run(
        [*mypy, "--python-executable", str(python), user.name],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert checked.stdout.splitlines()[0] == (
        f"{user.name}:5: error: Incompatible types in assignment (expression has type "
        '"list[str]", variable has type "int")  [assignment]'
    ), checked.stdout
