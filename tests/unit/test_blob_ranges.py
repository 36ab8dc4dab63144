"""Which bytes a Range header asks of a blob, and whether its conditions leave anything
to send (hypermedia.ingest.ranges): case tables."""

from __future__ import annotations

import pytest

from hypermedia.ingest.ranges import (
    ByteRange,
    Unsatisfiable,
    entity_tag,
    not_modified,
    requested,
)


@pytest.mark.parametrize(
    ("header", "size", "expected"),
    [
        ("bytes=0-9", 100, ByteRange(0, 9, 100)),
        ("bytes=0-0", 100, ByteRange(0, 0, 100)),
        ("bytes=90-", 100, ByteRange(90, 99, 100)),
        ("bytes=90-1000", 100, ByteRange(90, 99, 100)),  # an end past the blob's: its end
        ("bytes=99-99", 100, ByteRange(99, 99, 100)),
        ("bytes=-10", 100, ByteRange(90, 99, 100)),
        ("bytes=-1000", 100, ByteRange(0, 99, 100)),  # a suffix longer than the blob: all
        (" bytes=0-9 ", 100, ByteRange(0, 9, 100)),
        # Positions of more digits than Python reads (4,300): a 500 before.
        ("bytes=0-" + "9" * 5000, 100, ByteRange(0, 99, 100)),
        ("bytes=-" + "9" * 5000, 100, ByteRange(0, 99, 100)),
        ("bytes=" + "0" * 5000 + "5-9", 100, ByteRange(5, 9, 100)),
        ("bytes=1-" + "0" * 5000, 100, None),  # 1-0: malformed
        # Served whole (200): what this cannot serve as one range.
        (None, 100, None),
        ("bytes=0-1,5-6", 100, None),
        ("items=0-9", 100, None),
        ("bytes=9-1", 100, None),
        ("bytes=-", 100, None),
        ("bytes=a-b", 100, None),
        ("bytes 0-9", 100, None),
    ],
)
def test_the_range_asked_for(header, size, expected):
    assert requested(header, size) == expected


@pytest.mark.parametrize(
    ("header", "size"),
    [
        ("bytes=100-", 100),
        ("bytes=100-200", 100),
        ("bytes=-0", 100),
        ("bytes=0-", 0),
        ("bytes=-5", 0),
        ("bytes=" + "9" * 5000 + "-", 100),
    ],
)
def test_a_range_with_no_byte_of_the_blob_is_unsatisfiable(header, size):
    with pytest.raises(Unsatisfiable):
        requested(header, size)


TAG = entity_tag(100, 1_700_000_000_123_456_789, 42)


@pytest.mark.parametrize(
    ("if_range", "expected"),
    [
        (TAG, ByteRange(0, 9, 100)),  # still the blob the client has part of
        (f" {TAG} ", ByteRange(0, 9, 100)),
        ('"x"', None),  # replaced since: the whole blob
        (f"W/{TAG}", None),  # a weak tag never matches an If-Range
        ("Wed, 21 Oct 2015 07:28:00 GMT", None),  # a date: not checked, the whole blob
    ],
)
def test_if_range_serves_the_range_only_under_the_current_tag(if_range, expected):
    assert requested("bytes=0-9", 100, if_range=if_range, etag=TAG) == expected
    assert requested("bytes=0-9", 100, if_range=if_range) is None  # no tag to compare


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, False),
        (TAG, True),
        (f'"a", {TAG}', True),
        (f"W/{TAG}", True),  # If-None-Match compares weakly
        ("*", True),
        ('"a"', False),
        ("", False),
    ],
)
def test_not_modified(header, expected):
    assert not_modified(header, TAG) is expected


def test_the_tag_changes_with_the_file():
    assert TAG.startswith('"') and TAG.endswith('"')
    assert len({TAG, entity_tag(101, 1, 42), entity_tag(100, 2, 42), entity_tag(100, 1, 43)}) == 4
    assert entity_tag(100, 1_700_000_000_123_456_789, 42) == TAG


def test_the_answers_headers():
    wanted = ByteRange(90, 99, 100)
    assert (wanted.length, wanted.content_range) == (10, "bytes 90-99/100")
