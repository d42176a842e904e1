"""A private TorchInductor cache per process, removed when the process exits."""

from __future__ import annotations

import os
import shutil
import tempfile
from multiprocessing import util as _mp_util

__all__ = ["private_inductor_cache"]


def private_inductor_cache() -> str:
    """Point TorchInductor's on-disk cache (``TORCHINDUCTOR_CACHE_DIR``) at a fresh directory of
    this process and remove it when the process exits; call it before anything compiles.

    Why: ranks that compile the same graph at once would share (and race on) one cache, and a
    cache kept from an earlier run turns a compilation a test counts into a cache hit. A
    directory per process id did both jobs but was never removed (hundreds of them, a few MB
    each, after a day of test runs). Removal runs at any normal exit, a rank of
    :func:`meshshard.testing.run_ranks` included; a process killed by a signal leaves its
    directory behind.

    Returns
    -------
    str
        The directory.
    """
    path = tempfile.mkdtemp(prefix="meshshard-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    # a finalizer with an exit priority runs in multiprocessing's exit hook: registered with
    # atexit in every process, and called by a forked/spawned child before its os._exit
    _mp_util.Finalize(None, shutil.rmtree, args=(path,), kwargs={"ignore_errors": True},
                      exitpriority=0)  # fmt: skip
    return path
