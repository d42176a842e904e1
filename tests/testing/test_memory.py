"""meshshard.testing.memory's RSS helpers, which every benchmark's memory column uses."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from meshshard.testing.memory import PeakRss, peak_rss_bytes, reset_peak_rss, rss_bytes

MB = 2**20
SIZE = 96 * MB  # well above the few MB the interpreter moves by itself between two readings


def _touch(nbytes: int) -> np.ndarray:
    a = np.empty(nbytes, dtype=np.uint8)
    a[::4096] = 1  # every page resident
    return a


def test_rss_sees_an_allocation_and_its_release():
    before = rss_bytes()
    a = _touch(SIZE)
    during = rss_bytes()
    del a
    after = rss_bytes()
    assert during - before > 0.9 * SIZE
    assert during - after > 0.9 * SIZE  # large numpy buffers go back to the OS (mmap)


def test_peak_rss_sees_a_block_that_freed_what_it_took():
    with PeakRss(dt=0.001) as rss:
        a = _touch(SIZE)
        del a
    assert rss.growth > 0.9 * SIZE
    assert rss.peak >= rss.base


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux's")
def test_the_high_water_mark_resets():
    a = _touch(SIZE)
    del a
    high = peak_rss_bytes()
    assert reset_peak_rss()
    assert high - peak_rss_bytes() > 0.9 * SIZE
