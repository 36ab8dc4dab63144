"""Faults for a fork server, preloaded into it (tests only): the server killed at an
exact moment, as Ray kills an actor's children when it kills the actor, whatever
they are doing.

Preload ``tests.sandbox_faults`` in a :class:`~hypermedia.sandbox.executor.ChildExecutor`
(with :data:`tests.pipelines_for_tests.PRELOAD`). Its ``prepare_fork_server`` (run in
the server alone, before its sandbox starts) patches
:meth:`~hypermedia.sandbox.tinyinit.TinyInits.clone`: the first tiny init cloned once
the server serves (for its first spare) is stopped before it has run an instruction
of its own, its pid and blocked-signal mask written to :data:`STOPPED` in the
server's working directory (the work root), and the server killed with SIGKILL: a
server killed between an init's clone and the init's ``PDEATHSIG``. The test then
lets the init go on (``SIGCONT``) and sees what it does with no server.

The init is kept from running by the clone itself: the server clones it as a
``SCHED_FIFO`` process pinned to one CPU (the init inherits both and waits behind
the server on that CPU) and stops it before it lowers its own priority. A mask of 0
says it was stopped before its third step (signals blocked), so before its fourth
(``PDEATHSIG``); were it not, the server carries on and tries the next clone.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

STOPPED = "tiny-init-stopped"  # "<init pid> <SigBlk, hex>", in the server's work root


def _state(pid: int) -> tuple[str, int]:
    """A process's state letter and blocked-signal mask."""
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            fields[name] = value.strip()
    return fields["State"][:1], int(fields["SigBlk"], 16)


def prepare_fork_server() -> None:
    from hypermedia.sandbox.tinyinit import TinyInits

    clone = TinyInits.clone
    clones = 0

    def stopped_then_killed(self: Any) -> int:
        nonlocal clones
        clones += 1
        if clones == 1:  # the sandbox's start-up probe: the server is not serving yet
            return clone(self)
        affinity = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(affinity)})
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        try:
            init = clone(self)
            os.kill(init, signal.SIGSTOP)
        finally:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            os.sched_setaffinity(0, affinity)
        while _state(init)[0] != "T":
            time.sleep(0.001)
        _state_letter, blocked = _state(init)
        if blocked:  # it ran past its first steps before the stop: next time
            os.kill(init, signal.SIGCONT)
            return init
        with open(STOPPED + ".part", "w") as said:
            said.write(f"{init} {blocked:x}")
        os.rename(STOPPED + ".part", STOPPED)
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable: killed")

    TinyInits.clone = stopped_then_killed  # type: ignore[method-assign]
