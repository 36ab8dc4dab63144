"""Where `hypermedia run` writes each file's outputs, and the --out it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from hypermedia.errors import ConfigError
from hypermedia.runner import check_out_dir, named_files

BANNER = Path(__file__).resolve().parents[2] / "examples" / "banner.webp"


def _files(root: Path, *names: str) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(name.encode())


def test_a_directory_argument_names_its_files_by_their_path_in_it(tmp_path):
    _files(tmp_path / "in", "a/photo.jpg", "b/photo.jpg", "top.png", ".hidden/x.jpg")
    named = named_files([tmp_path / "in"])
    assert sorted(map(str, named.values())) == ["a/photo.jpg", "b/photo.jpg", "top.png"]
    assert named[tmp_path / "in" / "a" / "photo.jpg"] == Path("a/photo.jpg")


def test_a_file_argument_is_named_by_its_name():
    assert named_files([BANNER]) == {BANNER: Path("banner.webp")}


@pytest.mark.parametrize(
    "arguments",
    [
        ["in/a/photo.jpg", "in/b/photo.jpg"],  # two files of one name
        ["in/a", "in/b"],  # two folders holding one name
        ["in/a", "in/b/photo.jpg"],
    ],
)
def test_two_files_of_one_name_get_two_names(tmp_path, arguments):
    _files(tmp_path / "in", "a/photo.jpg", "b/photo.jpg")
    named = named_files([tmp_path / argument for argument in arguments])
    assert named == {
        tmp_path / "in/a/photo.jpg": Path("a/photo.jpg"),
        tmp_path / "in/b/photo.jpg": Path("b/photo.jpg"),
    }


def test_out_is_made_when_missing(tmp_path):
    check_out_dir(tmp_path / "new" / "out")
    assert (tmp_path / "new" / "out").is_dir()


@pytest.mark.parametrize("out", ["file", "file/below"])
def test_out_that_cannot_be_a_directory_is_refused_naming_the_option(tmp_path, out):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(ConfigError) as info:
        check_out_dir(tmp_path / out)
    assert info.value.key == "--out (HYPERMEDIA_RUN_OUT)"
    assert str(tmp_path / out) in info.value.message
