"""Where a bulk run's jobs go (hypermedia.bulk.service.place): the one rule the API and
the CLI both apply, on the queues the server has and those a worker serves."""

from __future__ import annotations

from typing import Any

import pytest

from hypermedia.bulk.runs import RunSpec
from hypermedia.bulk.service import Placement, place
from hypermedia.errors import InvalidRequest

ALL = ("images", "documents", "ocr", "media", "bulk")  # the shipped queues
NO_BULK = ("images", "documents", "ocr", "media")  # vps_only: no bulk worker


def spec(**fields: Any) -> RunSpec:
    return RunSpec(kind="backfill", operation="thumbnail", **fields)


@pytest.mark.parametrize(
    ("fields", "configured", "served", "placed"),
    [
        # none named: bulk at 8 where a worker serves it ...
        ({}, ALL, ALL, Placement("bulk", 8)),
        # ... else the operation's own queue at 10, after every user's job
        ({}, ALL, NO_BULK, Placement("images", 10)),
        ({}, NO_BULK, NO_BULK, Placement("images", 10)),
        # bulk served: bulk, wherever the own queue stands
        ({}, ALL, ("bulk",), Placement("bulk", 8)),
        ({}, ("bulk",), ("bulk",), Placement("bulk", 8)),
        # a priority given is kept, on either queue
        ({"priority": 7}, ALL, ALL, Placement("bulk", 7)),
        ({"priority": 9}, ALL, NO_BULK, Placement("images", 9)),
        # a queue named and served
        ({"queue": "bulk"}, ALL, ALL, Placement("bulk", 8)),
        ({"queue": "images"}, ALL, ALL, Placement("images", 10)),
        ({"queue": "images", "priority": 7}, ALL, NO_BULK, Placement("images", 7)),
    ],
)
def test_a_run_is_placed(
    fields: dict[str, Any], configured: tuple[str, ...], served: tuple[str, ...], placed: Placement
) -> None:
    assert place(spec(**fields), "images", configured, served) == placed


@pytest.mark.parametrize(
    ("fields", "configured", "served", "message"),
    [
        # bulk named where no worker serves it: its jobs would wait forever
        ({"queue": "bulk"}, ALL, NO_BULK, "queue: no worker serves the 'bulk' queue here"),
        # the operation's own queue, configured but served by no worker (bulk neither)
        ({}, ALL, ("ocr",), "queue: no worker serves the 'images' queue here"),
        ({"queue": "images"}, ALL, ("bulk",), "no worker serves the 'images' queue"),
        # a queue the server does not have
        ({"queue": "bulk"}, NO_BULK, NO_BULK, "this server has no 'bulk' queue"),
        ({"queue": "images"}, ("bulk",), ALL, "this server has no 'images' queue"),
        # neither bulk nor the operation's own
        ({"queue": "ocr"}, ALL, ALL, "queue must be 'bulk' or thumbnail's own 'images'"),
    ],
)
def test_a_run_that_could_not_run_is_refused_naming_queue(
    fields: dict[str, Any],
    configured: tuple[str, ...],
    served: tuple[str, ...],
    message: str,
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        place(spec(**fields), "images", configured, served)
    assert refused.value.details["queue"] == (fields.get("queue") or "images")
    assert message in refused.value.message
