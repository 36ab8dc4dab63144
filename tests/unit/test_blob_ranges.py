"""Which bytes a Range header asks of a blob (hypermedia.ingest.ranges): a case table."""

from __future__ import annotations

import pytest

from hypermedia.ingest.ranges import ByteRange, Unsatisfiable, requested


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
    ],
)
def test_a_range_with_no_byte_of_the_blob_is_unsatisfiable(header, size):
    with pytest.raises(Unsatisfiable):
        requested(header, size)


def test_if_range_serves_the_whole_blob():
    """The blob routes send no validator (ETag, Last-Modified) an If-Range could match."""
    assert requested("bytes=0-9", 100, if_range='"x"') is None


def test_the_answers_headers():
    wanted = ByteRange(90, 99, 100)
    assert (wanted.length, wanted.content_range) == (10, "bytes 90-99/100")
