"""Jobs, the one door to the job record: the pure state machine (``states``), its
guarded SQL (``repository``, ``statements``), credits (``credits``), the profile
catalog (``catalog``), the worker's side (``dispatcher``), and the reaper and
reconciler that keep Redis (:mod:`hypermedia.queue`) in line with the record
(``reaper``)."""
