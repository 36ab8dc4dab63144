"""The fork server's wire protocol: what the executor, the server and a job's child
say to each other (:mod:`hypermedia.sandbox.executor`,
:mod:`hypermedia.sandbox.forkserver`, :mod:`hypermedia.sandbox.child`).

All ``AF_UNIX``/``SOCK_SEQPACKET``::

    control socket (one per server)
        server -> executor  {"op": "ready", "pid": int, ...}   JSON, once preloaded
                            {"op": "failed", "error": str}     preload failed; exits
        executor -> server  REQUEST header (wall clock, disk budget), then the job's request for
                            the child: a marshal'ed dict (operation, input_path,
                            params, workdir, rlimits [[name, soft, hard], ...])
                            + SCM_RIGHTS: [server's end of the reply socket,
                                           child's end of the result socket]
        EOF                 the executor closed or died: kill every job, reap, exit

    channel (one per spare, server -> spare): the request, the result socket and (with
                          job uids) the network namespace of the job's uid

    reply socket (one per job, server <-> executor)
        server -> executor  STARTED (pid), then EXITED (how the child ended),
                            or FAILED + text (could not fork)
        executor -> server  CANCEL: kill the job (killed_for "cancelled")
        EOF                 nobody waits any more: kill the job ("abandoned")

    result socket (one per job, child -> executor): JSON messages. While the step
    runs, its progress (pipelines.progress), at most one per PROGRESS_INTERVAL, each
    sent without blocking (dropped when the socket is full):
        {"progress": {"done": float, "total": float | null, "unit": str}}
    then one result, at most RESULT_CAP bytes, written just before the child exits
        {"outputs": [{"output_type", "path", "content_type"}, ...]}
        {"error": {"code", "message", "retryable", "detail"}}
    The executor reads the socket while the child runs (so a child never blocks on
    it) and takes the last message that is not progress as the result.

The request is marshal, not JSON, because it only travels from the executor to a
child of the same interpreter and ``marshal.loads`` costs a fresh child half the
page faults of ``json.loads``; whatever comes back from a child is JSON. The
child cannot write on the reply socket, so it cannot forge how it ended; no
listening socket exists, so it cannot ask the server for more children.
"""

from __future__ import annotations

import struct

RESULT_CAP = 64 * 1024  # a child's result: ~400 outputs
PROGRESS_INTERVAL = 0.25  # seconds between a child's progress messages, at least
MESSAGE_CAP = 256 * 1024  # any message on the control socket
CHILD_LOG = ".child.log"  # in the job's workdir: the child's stdout and stderr
DEFAULT_SPARES = 4  # children the server forks ahead, unless its config says ("spares")

# Binary messages: a kind byte, then fixed fields.
REQUEST = struct.Struct("<dq")  # wall clock seconds, disk budget bytes (0: none); the
#                                 marshal'ed request follows
UID = struct.Struct("<I")  # server -> spare: the job's uid (0: none); the request follows
STARTED = struct.Struct("<ci")  # b"S", pid
EXITED = struct.Struct("<ciiicIqd")  # b"X", pid, exit code, signal, killed_for,
#                                      duration ms, max RSS kB, CPU seconds
RELAYED = struct.Struct("<ciqd")  # init -> server, on the channel: b"R", the job's wait
#                                   status, max RSS kB and CPU seconds of the namespace's processes
CANCEL = b"C"
FAILED = b"F"  # followed by the error text
KILLED_FOR = {
    None: b"-",
    "timeout": b"t",
    "disk": b"d",
    "cancelled": b"c",
    "shutdown": b"s",
    "abandoned": b"a",
}
KILLED_FOR_NAMES = {code: name for name, code in KILLED_FOR.items()}
