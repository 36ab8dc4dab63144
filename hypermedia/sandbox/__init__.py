"""Running pipeline steps in sandboxed child processes.

``hypermedia.sandbox.executor`` is the face (:class:`~hypermedia.sandbox.executor.ChildExecutor`);
``limits`` turns a profile's limits into rlimits, ``outcome`` reads what a child left
behind, ``forkserver`` is the warm helper process that forks the children, ``child``
what runs in one (the spare, then the job), ``wire`` the messages between them. Nothing is
imported here so that a pure module of this package stays cheap to import.
"""
