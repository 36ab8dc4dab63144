"""The backoff between tries of a blob deletion the storage failed."""

from __future__ import annotations

import pytest

from hypermedia.storage.deletions import MAX_DELAY_SECONDS, retry_delay


@pytest.mark.parametrize(
    ("failures", "seconds"),
    [(1, 60.0), (2, 120.0), (3, 240.0), (6, 1920.0), (7, MAX_DELAY_SECONDS), (10_000, 3600.0)],
)
def test_each_failure_doubles_the_pause_up_to_an_hour(failures, seconds):
    assert retry_delay(failures) == seconds


def test_no_failure_has_no_delay():
    with pytest.raises(ValueError, match="1 or more"):
        retry_delay(0)
