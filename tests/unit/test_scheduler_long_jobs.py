"""Which waiting jobs count as long transcodes (``QueueState.long_jobs``): the rule the
loop applies to the record and the simulator to its trace."""

from __future__ import annotations

import math

import pytest

from autoscaler.snapshot import LONG_JOB_SECONDS, expected_run_seconds, is_long

VIDEO_WALL = 3600 * 1.5  # the shipped transcode_video profile: timeout 3600 s
AUDIO_WALL = 900 * 1.5  # transcode_audio: timeout 900 s

CASES = [
    # (stated length, the profile's wall clock, expected run seconds, long)
    (2400.0, VIDEO_WALL, 2400.0, True),
    (7200.0, VIDEO_WALL, 5400.0, True),  # the wall clock ends it at 90 min: still long
    (1800.0, VIDEO_WALL, 1800.0, False),  # "over 30 minutes": exactly 30 is not
    (1800.001, VIDEO_WALL, 1800.001, True),
    (600.0, VIDEO_WALL, 600.0, False),
    (0.0, VIDEO_WALL, 0.0, False),
    (10800.0, AUDIO_WALL, 1350.0, False),  # 3 h of audio, killed after 22.5 min
    (10800.0, 1800.0, 1800.0, False),  # a wall clock of exactly 30 min
    (10800.0, 45.0, 45.0, False),  # an image profile's wall clock
    (None, VIDEO_WALL, None, False),  # the input states no length: unknown
    (None, math.inf, None, False),
    (2400.0, math.inf, 2400.0, True),  # the simulator's jobs: their own duration
]


@pytest.mark.parametrize(("stated", "wall", "expected", "long"), CASES)
def test_expected_run_seconds_and_long(stated, wall, expected, long):
    seconds = expected_run_seconds(stated, wall)
    assert seconds == expected
    assert is_long(seconds) is long


def test_the_threshold_is_the_seeds_thirty_minutes():
    assert LONG_JOB_SECONDS == 30 * 60
