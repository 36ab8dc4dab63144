"""Every file an operator writes (the settings' TOML, profiles.toml, scheduler.json, the
alert webhooks) that cannot be read as text refuses to start with a ConfigError naming
the file, never an ``internal: UnicodeDecodeError`` naming nothing."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from autoscaler import config as scheduler_config
from autoscaler import webhooks
from hypermedia.config import DEFAULT_QUEUES, REPO_ETC, load_settings
from hypermedia.errors import ConfigError
from hypermedia.profiles import load_profiles

# A Latin-1 "é" in a comment: what an editor set to another encoding writes.
NOT_UTF8 = b"\n# caf\xe9\n"


def settings_file(path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.setenv("HYPERMEDIA_CONFIG", str(path))
    return load_settings()


def profiles_file(path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    return load_profiles(path, DEFAULT_QUEUES)


def scheduler_file(path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    return scheduler_config.load(path)


def webhooks_file(path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    return webhooks.load(path)


READERS: dict[str, tuple[Callable[[Path, pytest.MonkeyPatch], object], bytes]] = {
    "settings": (settings_file, b"api_port = 8080\n"),
    "profiles": (profiles_file, (REPO_ETC / "profiles.toml").read_bytes()),
    "scheduler": (scheduler_file, (REPO_ETC / "scheduler.json").read_bytes()),
    "webhooks": (webhooks_file, b'{"webhooks": []}'),
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_file_that_is_not_utf8_is_refused_naming_it(reader, tmp_path, monkeypatch):
    read, good = READERS[reader]
    path = tmp_path / f"{reader}.conf"
    path.write_bytes(good)
    os.chmod(path, 0o600)
    read(path, monkeypatch)  # the file as written loads
    path.write_bytes(good.rstrip(b"}") + NOT_UTF8 + (b"}" if good.endswith(b"}") else b""))
    with pytest.raises(ConfigError) as caught:
        read(path, monkeypatch)
    assert str(path) in caught.value.message
    assert "UTF-8" in caught.value.message


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_directory_is_refused_naming_it(reader, tmp_path, monkeypatch):
    read, _ = READERS[reader]
    path = tmp_path / "etc"
    path.mkdir()
    with pytest.raises(ConfigError) as caught:
        read(path, monkeypatch)
    assert str(path) in caught.value.message or "HYPERMEDIA_CONFIG" in caught.value.key
