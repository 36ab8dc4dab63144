"""A `ray up` head's services start only on a Ray head whose queue_<name> slots are
their pools (autoscaler.head.check_head_slots), read from a real head's GCS."""

from __future__ import annotations

import os

import pytest

from autoscaler import raynodes
from autoscaler.head import check_head_slots
from tests.ray_support import SHARED_QUEUES, SHARED_SLOTS, shared_head


def test_the_head_services_refuse_slots_that_differ_from_their_pools():
    head = shared_head()
    slots = SHARED_SLOTS * int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    [found] = [n for n in raynodes.nodes(head.address) if n.alive and n.head]
    assert {k: v for k, v in found.resources.items() if k.startswith("queue_")} == {
        f"queue_{q}": float(slots) for q in SHARED_QUEUES
    }
    pools = dict.fromkeys(SHARED_QUEUES, slots)
    check_head_slots(head.address, pools, "hybrid")  # the same: the services start
    # a slot more than the pools (cloud_first keeps one media worker on the VPS): refused
    with pytest.raises(SystemExit) as refused:
        check_head_slots(head.address, {**pools, "media": 1}, "cloud_first")
    said = str(refused.value)
    assert f"'queue_media': {float(slots)}" in said and "'queue_media': 1.0" in said
    assert "mode cloud_first" in said and "`ray up` again" in said
