"""The job's view, as values (hypermedia.sandbox.isolation.plan_view and friends), and
the rule that external tools get argument lists, never a shell."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hypermedia.sandbox.isolation import (
    DEFAULT_COVERED,
    LoadedModule,
    Mount,
    code_view,
    cover_of,
    module_top,
    out_of_sight,
    outermost,
    plan_view,
)

REPO = Path(__file__).resolve().parents[2]


def cover(path: str) -> Mount:
    return Mount("cover", path)


def expose(path: str) -> Mount:
    return Mount("expose", path)


def test_hidden_paths_are_covered_and_the_interpreter_under_them_bound_back():
    plan = plan_view(
        covers=["/tmp", "/root", "/run"],
        exposes=["/root/.pyenv/versions/3.11.7", "/srv/app/.venv/lib", "/usr/lib/python3"],
        work_root="/srv/work/w1",
    )
    assert plan == [
        cover("/root"),
        cover("/run"),
        cover("/tmp"),
        cover("/srv/work/w1"),
        expose("/root/.pyenv/versions/3.11.7"),
    ]


@pytest.mark.parametrize(
    ("path", "hidden_already"),
    [
        ("/tmp/pytest-of-me/test_x0", True),  # a test's data dir: under the /tmp cover
        ("/tmp", True),  # a cover itself
        ("/srv/work/w1/data", True),  # inside the work root
        ("/srv/hm/data", False),  # under no cover: visible
        ("/root/.pyenv", False),  # holds an expose: hiding it hides the interpreter
        ("/root/.pyenv/versions/3.11.7/lib", False),  # inside an expose: visible
        ("/root/.cache", True),
        ("/opt/app/lib/python3/secret", False),  # under no cover (its expose is no step)
    ],
)
def test_a_path_is_out_of_sight_when_hiding_it_changes_nothing(path, hidden_already):
    covers = ["/tmp", "/root", "/run"]
    exposes = ["/root/.pyenv/versions/3.11.7", "/opt/app/lib", "/usr/lib/python3"]
    plan = plan_view(covers, exposes, work_root="/srv/work/w1")
    assert out_of_sight(plan, exposes, path) is hidden_already
    if hidden_already:  # what hiding it gives: the same view
        assert plan_view(covers, exposes, "/srv/work/w1", hidden=[path]) == plan
    else:
        assert plan_view(covers, exposes, "/srv/work/w1", hidden=[path]) != plan


def test_the_work_root_is_always_covered_and_never_exposed():
    plan = plan_view(covers=[], exposes=["/w/jobs/x", "/w"], work_root="/w")
    assert plan == [cover("/w")]
    assert cover_of(plan, "/w/jobs") == "/w"


def test_a_cover_inside_an_exposed_path_is_applied_after_it():
    """The repository is on sys.path under a hidden home, and the work root is in it."""
    plan = plan_view(
        covers=["/home"], exposes=["/home/me/repo"], work_root="/home/me/repo/var/work/w1"
    )
    assert plan == [
        cover("/home"),
        expose("/home/me/repo"),
        cover("/home/me/repo/var/work/w1"),
    ]
    assert cover_of(plan, "/home/me/repo/var/work/w1/jobs") == "/home/me/repo/var/work/w1"


def test_mounts_that_change_nothing_are_left_out():
    plan = plan_view(
        covers=["/tmp", "/tmp/inner", "/var/tmp"],
        exposes=["/usr/lib", "/usr/lib/python3", "/root/a", "/root/a/b"],
        work_root="/tmp/pytest/work",
    )
    # /tmp/inner and the work root are inside /tmp already; /usr/lib is visible
    # anyway; /root is not hidden, so nothing under it needs binding back.
    assert plan == [cover("/tmp"), cover("/var/tmp")]
    assert cover_of(plan, "/tmp/pytest/work/jobs") == "/tmp"


def test_a_cover_wins_over_an_expose_of_the_same_path():
    plan = plan_view(covers=["/root", "/opt"], exposes=["/opt"], work_root="/root/w")
    assert plan == [cover("/opt"), cover("/root")]


def test_nothing_at_or_under_a_hidden_path_is_exposed():
    """The data dir on sys.path (the operator started in it): hidden, with all it holds,
    while the interpreter under a covered /root is still bound back."""
    plan = plan_view(
        covers=["/root"],
        exposes=["/srv/data", "/srv/data/lib", "/root/.pyenv/versions/3.11.7"],
        work_root="/srv/data/work/w1",
        hidden=["/srv/data"],
    )
    assert plan == [cover("/root"), cover("/srv/data"), expose("/root/.pyenv/versions/3.11.7")]
    assert cover_of(plan, "/srv/data/work/w1/jobs") == "/srv/data"


def test_the_code_view_exposes_packages_not_the_directories_they_came_from():
    view = code_view(
        prefixes=["/root/.pyenv/versions/3.11.7", "/srv/app/.venv"],
        search_path=[
            "/root/.pyenv/versions/3.11.7/lib/python3.11",
            "/srv/app/.venv/lib/python3.11/site-packages",
            "/home/me/.local/lib/python3.11/site-packages",
            "/srv/app",  # the driver's working directory, put there by Ray
            "/srv/app/src",  # a checkout on PYTHONPATH
            "/opt/eggs/thing.egg",
            "/usr/local/bin",
            "/",
        ],
        modules=[
            LoadedModule("os", "/root/.pyenv/versions/3.11.7/lib/python3.11/os.py", False),
            LoadedModule(
                "hypermedia.sandbox.forkserver", "/srv/app/hypermedia/sandbox/f.py", False
            ),
            LoadedModule("pipelines", "/srv/app/pipelines/__init__.py", True),
            LoadedModule("tool", "/srv/app/src/tool.py", False),
            LoadedModule("odd.name", "/srv/app/elsewhere/name.py", False),
            LoadedModule("ns", None, True, ("/srv/app/src/ns", "/srv/app/notns")),
        ],
        also_cover=["/srv/app", "/etc"],
    )
    assert sorted(view.exposes) == [
        "/home/me/.local/lib/python3.11/site-packages",
        "/opt/eggs/thing.egg",
        "/root/.pyenv/versions/3.11.7",
        "/srv/app/.venv",
        "/srv/app/elsewhere/name.py",  # its directories do not spell its name: alone
        "/srv/app/hypermedia",
        "/srv/app/pipelines",
        "/srv/app/src/ns",
        "/srv/app/src/tool.py",
    ]
    # Never / or a system tree (a worker started in /usr/local/bin keeps its tools).
    assert view.covers == ("/srv/app", "/srv/app/src")
    plan = plan_view(DEFAULT_COVERED + view.covers, view.exposes, "/srv/data/work/w1")
    assert cover("/srv/app") in plan and expose("/srv/app/hypermedia") in plan
    assert expose("/srv/app/.venv") in plan


def test_a_code_directory_that_is_exposed_is_not_covered():
    view = code_view(
        prefixes=["/srv/app/.venv"],
        search_path=["/srv/app/.venv/lib/python3.11/site-packages", "/srv/lib/pkg"],
        modules=[LoadedModule("pkg", "/srv/lib/pkg/__init__.py", True)],
        also_cover=["/srv/app/.venv/bin"],
    )
    assert view.covers == ()
    assert module_top(LoadedModule("a.b.c", "/x/a/b/c.py", False)) == ["/x/a"]
    assert module_top(LoadedModule("m", "/x/m.py", False)) == ["/x/m.py"]


def test_hiding_the_root_is_refused():
    with pytest.raises(ValueError, match="cannot hide /"):
        plan_view(covers=["/"], exposes=[], work_root="/w")


def test_similar_names_are_not_nested():
    plan = plan_view(covers=["/tmp"], exposes=["/tmpfiles/x"], work_root="/w")
    assert plan == [cover("/tmp"), cover("/w")]


def test_outermost_keeps_the_paths_not_inside_another():
    assert outermost(["/a/b", "/a", "/c/d", "/c/d/e", "/ab"]) == ["/a", "/ab", "/c/d"]


# -- external tools: argument lists only ------------------------------------------------


def _shell_uses(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        if name in {"os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput"}:
            found.append(f"{name}() at line {node.lineno}")
        for keyword in node.keywords:
            if keyword.arg == "shell" and not (
                isinstance(keyword.value, ast.Constant) and keyword.value.value is False
            ):
                found.append(f"{name}(shell=...) at line {node.lineno}")
        is_run = name.split(".")[-1] in {"run", "Popen", "call", "check_call", "check_output"}
        if is_run and name.startswith(("subprocess.", "Popen", "run")) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant | ast.JoinedStr | ast.BinOp):
                found.append(f"{name}() with a string command at line {node.lineno}")
    return found


@pytest.mark.parametrize(
    "path",
    sorted((REPO / "pipelines").rglob("*.py"))
    + sorted((REPO / "hypermedia" / "sandbox").glob("*.py")),
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_steps_call_tools_with_argument_lists_never_a_shell(path):
    assert _shell_uses(ast.parse(path.read_text(), str(path))) == []


def test_the_shell_check_catches_what_it_should():
    source = """
import os, subprocess
os.system("ffmpeg -i " + name)
subprocess.run("soffice --convert-to pdf x", shell=True)
subprocess.run(f"tesseract {name} out")
subprocess.run(["ffmpeg", "-i", path])
subprocess.Popen(["soffice"], shell=False)
"""
    lines = {finding.rsplit(" ", 1)[1] for finding in _shell_uses(ast.parse(source))}
    assert lines == {"3", "4", "5"}
