"""Workers: the claim loops (``loop``), one job end to end (``execute``), the
worker that runs N loops with heartbeats and metrics (``worker``), its Ray actor
(``actor``), and the supervisor that keeps the pools alive (``supervisor``)."""
