"""The CLI's and ``ray start``'s processes end without the interpreter's last
garbage collection of their whole heap (hypermedia.exits)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# An atexit handler registered before ``main`` runs after those ``main`` registers
# (last registered, first run): it sees the heap as finalization will.
_PROBE = """
import atexit, gc, sys
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count()))
sys.argv = [{argv0!r}, "--help"]
from {module} import main
main()
"""


@pytest.mark.parametrize(
    ("module", "argv0"),
    [("hypermedia.cli", "hypermedia"), ("hypermedia.worker.ray_start", "ray")],
)
def test_the_heap_is_frozen_once_the_exit_handlers_ran(module, argv0):
    """The end of ``hypermedia run examples/`` spent ~0.45 CPU-s (~2 s on a loaded
    machine) collecting a heap the exit frees anyway; a head's ``ray start`` ~0.15."""
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE.format(module=module, argv0=argv0)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    (said,) = [line for line in probe.stdout.splitlines() if line.startswith("frozen at exit:")]
    # Everything the command imported: tens of thousands of objects.
    assert int(said.split(":")[1]) > 10_000, said
