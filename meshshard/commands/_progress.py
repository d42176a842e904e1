"""One progress bar over a command's stages (read, graph, partition, metrics, write, render).

Shown on stderr only when it is a terminal and only on rank 0 (``RANK`` unset or 0 under
torchrun); the elapsed time ticks during a long stage, so a 30 s dual-graph build is visible.
Every stage is timed whether or not the bar is shown: :attr:`Stages.timings`.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from meshshard.comm.launch import launch
from meshshard.errors import InputError

__all__ = ["Stages", "progress_enabled"]


def progress_enabled(no_progress: bool = False) -> bool:
    """A bar only for people: stderr is a TTY, this is rank 0, and not ``--no-progress``."""
    if no_progress:
        return False
    try:
        rank = launch().rank
    except InputError:  # odd launcher variables (e.g. RANK without WORLD_SIZE): no bar; the
        return False    # command that needs the rank reports them
    return rank == 0 and sys.stderr.isatty()


class Stages:
    """Time named stages and show them on one tqdm bar.

    Parameters
    ----------
    desc : str
        Bar label (e.g. ``"partition"``).
    total : int
        Number of stages expected.
    enabled : bool
        Show the bar (see :func:`progress_enabled`).
    """

    def __init__(self, desc: str, total: int, *, enabled: bool) -> None:
        self.timings: dict[str, float] = {}
        self._bar: Any = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total, desc=desc, unit="stage", leave=False, file=sys.stderr,
                bar_format="{desc}: {n_fmt}/{total_fmt} stages |{bar:20}| {elapsed}{postfix}",
            )  # fmt: skip
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            bar = self._bar
            if bar is not None:
                bar.refresh()

    def set_total(self, total: int) -> None:
        """The number of stages, once it is known (e.g. after reading the input)."""
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    @contextmanager
    def stage(self, name: str, note: str = "") -> Iterator[None]:
        """Time the block as stage ``name``; the bar shows ``name`` (and ``note``) meanwhile."""
        if self._bar is not None:
            self._bar.set_postfix_str(f"{name}{' (' + note + ')' if note else ''}", refresh=True)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0
            if self._bar is not None:
                self._bar.update(1)

    def close(self) -> None:
        """Remove the bar (it is not left on the screen)."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=2)
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Stages:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
