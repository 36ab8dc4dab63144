"""Job priorities (1 most urgent .. 10) and the seed's routing bands.

Pure: the scheduler's policy routes by band (1-3 on-demand/VPS, 7-10 spot-preferred),
the metrics label queue depth and age by band, and the alerts watch the oldest job of
band 1-3; all of them ask :func:`band_of`.
"""

from __future__ import annotations

from typing import Literal

Band = Literal["1-3", "4-6", "7-10"]
BANDS: tuple[Band, ...] = ("1-3", "4-6", "7-10")


def band_of(priority: int) -> Band:
    """The routing band of a job priority (1 most urgent .. 10)."""
    if priority <= 3:
        return "1-3"
    if priority <= 6:
        return "4-6"
    return "7-10"
