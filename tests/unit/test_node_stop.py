"""RayNode.stop's wait for the node's processes (hypermedia.worker.cluster)."""

from __future__ import annotations

import signal
import subprocess

import psutil

from hypermedia.worker.cluster import _wait_dead


def test_a_zombie_that_is_not_ours_counts_as_ended():
    """The node's daemons are not our children (``ray start`` leaves them to init); an
    init that reaps late (this machine's: 1-2 s) held every stop that long, psutil's
    wait seeing a zombie as alive (`hypermedia run`'s stop 4.2 s -> 0.5 s). Here the
    zombie's parent never reaps at all."""
    parent = subprocess.Popen(
        ["bash", "-c", "sleep 600 & echo $!; exec sleep 600"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        child = psutil.Process(int(parent.stdout.readline()))
        running = psutil.Process(parent.pid)
        assert _wait_dead([child, running], 0) == [child, running]
        child.send_signal(signal.SIGKILL)
        assert _wait_dead([child], 5) == []
        assert child.status() == psutil.STATUS_ZOMBIE  # still there: not ours to reap
        _gone, alive = psutil.wait_procs([child], timeout=0.2)
        assert alive == [child]  # what the stop asked before
        # Our own child, ended, is reaped as it is found dead.
        parent.kill()
        assert _wait_dead([running], 5) == []
        assert not psutil.pid_exists(parent.pid)
    finally:
        parent.kill()
        parent.wait()
