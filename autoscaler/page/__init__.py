"""The operator page: the platform at a glance in a browser, served by the head.

:mod:`.routes` mounts it on the API's app (:func:`~autoscaler.page.routes.install`):
``GET /operator`` renders ``hypermedia status`` (:func:`autoscaler.status.gather`) with
charts of the last hours (:mod:`.charts`) and the decision log, server-side with Jinja2
(``templates/``), for an operator's API key. The charts are drawn by uPlot, served from
the package (``static/``, no CDN).

The core's app (:func:`hypermedia.ingest.api.create_app`) knows nothing of it: the core
never imports the autoscaler, so what starts the head mounts it (``hypermedia serve``,
``hypermedia head``, and :mod:`autoscaler.head` under ``ray up``).
"""
