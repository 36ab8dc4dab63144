"""A misspelt HYPERMEDIA_* variable is refused by name, never silently ignored."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hypermedia.cli import (
    PID_INIT_VARIABLE,
    SCRIPT_PREFIXES,
    _known_variables,
    check_environment,
)
from hypermedia.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("HYPERMEDIA_DATABSE_URL", "HYPERMEDIA_DATABASE_URL"),
        ("HYPERMEDIA_REDIS_ULR", "HYPERMEDIA_REDIS_URL"),
        ("HYPERMEDIA_APIKEY", "HYPERMEDIA_API_KEY"),
    ],
)
def test_misspelt_variable_names_the_likely_one(name, suggestion):
    with pytest.raises(ConfigError) as caught:
        check_environment({name: "x"})
    assert caught.value.key == name
    assert suggestion in caught.value.message


def test_unrelated_name_is_refused_without_a_guess():
    with pytest.raises(ConfigError, match=r"unknown setting$"):
        check_environment({"HYPERMEDIA_ZZZZZZZZZZZZZZZZZZZZ": "1"})


def test_every_known_variable_passes():
    known = _known_variables()
    # Settings fields and CLI option twins alike.
    assert {"HYPERMEDIA_DATABASE_URL", "HYPERMEDIA_API_KEY", "HYPERMEDIA_RUN_OPS"} <= known
    environ = dict.fromkeys(known, "x")
    environ["HYPERMEDIA_SANDBOX_PID_INIT"] = "copy"  # checked here: "tiny" or "copy"
    environ["HYPERMEDIA_QUEUES__IMAGES__CONCURRENCY"] = "8"
    environ["HYPERMEDIA_TEST_PG_URL"] = "postgresql://elsewhere"
    environ["PATH"] = "/usr/bin"
    check_environment(environ)


def test_the_command_refuses_before_doing_anything():
    result = subprocess.run(
        [sys.executable, "-m", "hypermedia.cli", "queues"],
        env={"PATH": "/usr/bin:/bin", "HYPERMEDIA_DATABSE_URL": "sqlite:///x.db"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "HYPERMEDIA_DATABSE_URL: unknown setting" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_refused_secret_is_printed_nowhere(tmp_path):
    """Neither the error line nor the debug log's traceback carries a refused secret."""
    for variable, value, secret in [
        ("HYPERMEDIA_STORAGE_SECRET", "hunter2-topsecret", "hunter2"),
        ("HYPERMEDIA_DATABASE_URL", "mysql://bob:S3cretPass@db.example/x", "S3cretPass"),
    ]:
        result = subprocess.run(
            [sys.executable, "-m", "hypermedia.cli", "--log-level", "debug", "db", "upgrade"],
            env={
                "PATH": "/usr/bin:/bin",
                "PYTHONPATH": str(REPO),  # this checkout's code, whatever is installed
                "HYPERMEDIA_DATA_DIR": str(tmp_path),
                variable: value,
            },
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 1
        assert f"error: config_invalid: {variable.removeprefix('HYPERMEDIA_').lower()}" in (
            result.stderr
        )
        assert secret not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        (
            "HYPERMEDIA_QUEUES__IMAGE__CONCURRENCY",
            "no queue 'image' (the queues: bulk, documents, images, media, ocr; a new one is "
            "defined in HYPERMEDIA_QUEUES or the config file's [queues.<name>]); "
            "did you mean HYPERMEDIA_QUEUES__IMAGES__CONCURRENCY?",
        ),
        ("HYPERMEDIA_QUEUES__ZZZZZZ__WORKERS", "no queue 'zzzzzz' (the queues: "),
        (
            "HYPERMEDIA_QUEUES__IMAGES__CONCURENCY",
            "unknown setting of queue 'images' (concurrency, cpus, prefetch, workers); "
            "did you mean HYPERMEDIA_QUEUES__IMAGES__CONCURRENCY?",
        ),
    ],
)
def test_a_misspelt_queue_variable_is_refused(name, problem):
    """It added a queue of that name (or left the queue's setting unset) silently."""
    with pytest.raises(ConfigError) as caught:
        check_environment({name: "8"})
    assert caught.value.key == name
    assert caught.value.message.startswith(f"{name}: {problem}")


def test_a_queue_of_ones_own_takes_queue_variables(tmp_path):
    check_environment(
        {"HYPERMEDIA_QUEUES": '{"thumbs": {}}', "HYPERMEDIA_QUEUES__THUMBS__WORKERS": "2"}
    )
    config = tmp_path / "hypermedia.toml"
    config.write_text("[queues.scans]\nconcurrency = 2\n")
    check_environment(
        {"HYPERMEDIA_CONFIG": str(config), "HYPERMEDIA_QUEUES__SCANS__CONCURRENCY": "3"}
    )
    # A queue the profiles route an operation to.
    profiles = tmp_path / "profiles.toml"
    profiles.write_text('[profiles.thumbnail]\nqueue = "previews"\n')
    check_environment(
        {"HYPERMEDIA_PROFILES_PATH": str(profiles), "HYPERMEDIA_QUEUES__PREVIEWS__WORKERS": "1"}
    )
    check_environment({"HYPERMEDIA_QUEUES__OCR": '{"workers": 0}'})


VARIABLE = r"\bHYPERMEDIA_[A-Z0-9_]*[A-Z0-9]\b"


@pytest.mark.parametrize("readme", ["README.md", "docker/README.md", "bench/README.md"])
def test_every_variable_the_readme_names_is_known(readme):
    """A variable the README tells the operator to set is one the CLI lets through (the
    README's HYPERMEDIA_SANDBOX_PID_INIT was refused as a misspelling of _HIDDEN;
    docker/README's HYPERMEDIA_IMAGE_CACHE, exported for docker/build, made every
    `hypermedia` command refuse to start). The worker image's build arguments are no
    variables."""
    import re

    named = set(re.findall(VARIABLE, (REPO / readme).read_text()))
    build_args = set(
        re.findall(r"^ARG (\w+)", (REPO / "docker/worker.Dockerfile").read_text(), re.M)
    )
    named = {n for n in named - build_args if not n.startswith("HYPERMEDIA_QUEUES__")}
    assert named
    assert sorted(n for n in named - _known_variables() if not n.startswith(SCRIPT_PREFIXES)) == []
    for name in named:
        check_environment({name: "1"} if name != PID_INIT_VARIABLE else {name: "copy"})


def test_every_variable_the_scripts_read_is_known():
    import re

    scripts = [REPO / "docker/build", REPO / "docker/smoke", REPO / ".ci/run"]
    scripts += [*(REPO / "scripts").iterdir(), *(REPO / "docker/host").iterdir()]
    read = {name for path in scripts for name in re.findall(VARIABLE, path.read_text())}
    assert "HYPERMEDIA_IMAGE_CACHE" in read
    assert sorted(n for n in read - _known_variables() if not n.startswith(SCRIPT_PREFIXES)) == []


def test_a_documented_sandbox_init_passes_and_a_wrong_one_is_refused_by_name():
    from hypermedia.cli import PID_INIT_VARIABLE
    from hypermedia.sandbox.executor import PID_INIT_ENV

    assert PID_INIT_VARIABLE == PID_INIT_ENV
    check_environment({"HYPERMEDIA_SANDBOX_PID_INIT": "copy"})
    check_environment({"HYPERMEDIA_SANDBOX_PID_INIT": "tiny"})
    with pytest.raises(ConfigError) as caught:
        check_environment({"HYPERMEDIA_SANDBOX_PID_INIT": "Copy"})
    assert caught.value.key == "HYPERMEDIA_SANDBOX_PID_INIT"
    assert "'tiny' or 'copy'" in caught.value.message


@pytest.mark.parametrize("command", [["db", "upgrade"], ["status"]])
@pytest.mark.parametrize("variable", ["HYPERMEDIA_DATABASE_URL", "HYPERMEDIA_DATA_DIR"])
def test_a_sqlite_record_whose_directory_cannot_be_made_names_its_setting(
    tmp_path, variable, command
):
    """`db upgrade` (and `status`, which made the record's file private first) on a
    SQLite file under a path that cannot be a directory printed `error: internal:
    FileNotFoundError` (NotADirectoryError here); it names the setting and the path
    (`status`, which opens an existing record only, says there is none: 45c6878)."""
    blocker = tmp_path / "a file"
    blocker.write_text("")
    data_dir = tmp_path / "data"
    environment = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "HYPERMEDIA_DATA_DIR": str(data_dir),
    }
    if variable == "HYPERMEDIA_DATABASE_URL":
        environment[variable] = f"sqlite:///{blocker}/sub/x.db"
        key = "database_url (HYPERMEDIA_DATABASE_URL)"
    else:
        environment[variable] = str(blocker / "data")
        key = "data_dir (HYPERMEDIA_DATA_DIR)"
    result = subprocess.run(
        [sys.executable, "-m", "hypermedia.cli", *command],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    said = "no database at " if command == ["status"] else "cannot make "
    assert result.stderr.startswith(f"error: config_invalid: {key}: {said}"), result.stderr
    assert str(blocker) in result.stderr
