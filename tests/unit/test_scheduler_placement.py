"""The VPS's share of each queue's baseline, by mode (autoscaler.placement.vps_pools):
the one rule the head's pools, its Ray slots, the policy's floor and the fleet's
request all follow."""

from __future__ import annotations

import pytest

from autoscaler import admission, placement
from tests.unit.test_scheduler_policy import make_config

# make_config: the shipped queues (images and documents: baseline 1, not cloud-enabled;
# ocr, media, bulk: baseline 0) with ocr (max 10) and bulk cloud-enabled.


@pytest.mark.parametrize(
    ("mode", "changes", "pools"),
    [
        # vps_only: the VPS holds every baseline
        (
            "vps_only",
            {"queues__ocr__baseline_workers": 3},
            {"images": 1, "documents": 1, "ocr": 3, "media": 0, "bulk": 0},
        ),
        # hybrid: the VPS handles the baseline, cloud-enabled or not
        (
            "hybrid",
            {"queues__ocr__baseline_workers": 3, "queues__bulk__baseline_workers": 2},
            {"images": 1, "documents": 1, "ocr": 3, "media": 0, "bulk": 2},
        ),
        # cloud_first: one VPS worker of a cloud-enabled queue with a baseline
        (
            "cloud_first",
            {"queues__ocr__baseline_workers": 3, "queues__bulk__baseline_workers": 2},
            {"images": 1, "documents": 1, "ocr": 1, "media": 0, "bulk": 1},
        ),
        # ... a baseline of one is that worker; a baseline of 0 keeps none
        (
            "cloud_first",
            {"queues__ocr__baseline_workers": 1},
            {"images": 1, "documents": 1, "ocr": 1, "media": 0, "bulk": 0},
        ),
        # ... and a queue that is not cloud-enabled keeps its whole baseline
        (
            "cloud_first",
            {"queues__images__baseline_workers": 2, "queues__images__max_workers": 2},
            {"images": 2, "documents": 1, "ocr": 0, "media": 0, "bulk": 0},
        ),
        (
            "cloud_first",
            {"queues__ocr__baseline_workers": 4, "queues__ocr__cloud_enabled": False},
            {"images": 1, "documents": 1, "ocr": 4, "media": 0, "bulk": 0},
        ),
    ],
)
def test_the_vps_share_per_mode(mode, changes, pools):
    assert placement.vps_pools(make_config(mode, **changes)) == pools


@pytest.mark.parametrize("mode", ["vps_only", "hybrid", "cloud_first"])
@pytest.mark.parametrize("baseline", [0, 1, 2, 5])
@pytest.mark.parametrize("cloud_enabled", [False, True])
def test_the_share_never_passes_the_baseline_and_leaves_no_queue_without_a_worker(
    mode, baseline, cloud_enabled
):
    config = make_config(
        mode,
        queues__ocr__baseline_workers=baseline,
        queues__ocr__cloud_enabled=cloud_enabled,
    )
    share = placement.vps_pools(config)["ocr"]
    assert 0 <= share <= baseline
    # The VPS keeps at least one worker of a queue with a baseline, in every mode: the
    # daily cap's lock (no cloud until the reset) never leaves it with none.
    assert share >= min(baseline, placement.MINIMAL_VPS_WORKERS)
    # Less than the baseline only where the cloud takes the rest.
    if share < baseline:
        assert mode == "cloud_first" and cloud_enabled
    # What the head's ingest accepts follows: a queue with a share is staffed; one
    # without is staffed only where the cloud may take it.
    staffed = "ocr" in admission.staffed(config)
    assert staffed == (share > 0 or (mode != "vps_only" and cloud_enabled))
