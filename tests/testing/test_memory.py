"""meshshard.testing.memory's RSS helpers, which every benchmark's memory column uses."""

from __future__ import annotations

import mmap
import sys
import time

import numpy as np
import pytest

from meshshard.testing.memory import PeakRss, peak_rss_bytes, reset_peak_rss, rss_bytes

MB = 2**20
SIZE = 96 * MB  # well above the few MB the interpreter moves by itself between two readings


def _touch(nbytes: int) -> mmap.mmap:
    """Fresh anonymous pages, all resident; closing returns them to the OS. (Not np.empty: a
    heap the allocator already holds, e.g. after other tests tuned malloc, adds no RSS.)"""
    m = mmap.mmap(-1, nbytes)
    view = np.frombuffer(m, dtype=np.uint8)
    view[::4096] = 1
    del view
    return m


def test_rss_sees_an_allocation_and_its_release():
    before = rss_bytes()
    a = _touch(SIZE)
    during = rss_bytes()
    a.close()
    after = rss_bytes()
    assert during - before > 0.9 * SIZE
    assert during - after > 0.9 * SIZE


def test_peak_rss_sees_a_block_that_freed_what_it_took():
    with PeakRss(dt=0.001) as rss:
        m = _touch(SIZE)
        time.sleep(0.2)  # held long enough for a sample even on a loaded machine
        m.close()
    assert rss.growth > 0.9 * SIZE
    assert rss.peak >= rss.base


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux's")
def test_the_high_water_mark_resets():
    _touch(SIZE).close()
    high = peak_rss_bytes()
    assert reset_peak_rss()
    assert high - peak_rss_bytes() > 0.9 * SIZE
