"""Jobs: the pure state machine (``states``) and its guarded SQL (``repository``)."""
