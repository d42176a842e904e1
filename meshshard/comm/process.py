"""Process-group helpers for scripts run under torchrun: start (:func:`init`, with meshshard's
collective timeout) and end (:func:`shutdown`).

Timeout: every process group meshshard creates (``init``, ``meshshard.testing.run_ranks``) and
every group created after ``init`` (DeviceMesh sub-groups included) ends a collective that some
rank never joins after :func:`collective_timeout`: the ``timeout`` argument, else
``MESHSHARD_TIMEOUT`` (seconds) from the environment, else 5 minutes (torch's own default is 30
minutes for gloo, 10 for NCCL). On gloo the stuck collective raises on the waiting ranks; on
NCCL ``init`` keeps torch's asynchronous error handling on, so the watchdog ends the process
with the timed-out op in its log (and in debug mode sets ``TORCH_NCCL_BLOCKING_WAIT`` so the
error is raised in the caller instead).

Debug mode: ``MESHSHARD_DEBUG_COLLECTIVES=1`` makes meshshard's collectives agree on each call
first (see :mod:`meshshard.comm.check`).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import math
import os
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import torch.distributed as dist

from meshshard.comm.check import (
    DEBUG_ENV,
    CollectiveMismatchError,
    CollectiveWaitError,
    check_collective,
    debug_enabled,
    set_debug,
)
from meshshard.comm.launch import launch
from meshshard.comm.signals import end_blocked_on_signal

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEBUG_ENV",
    "DEFAULT_TIMEOUT_S",
    "TIMEOUT_ENV",
    "CollectiveMismatchError",
    "CollectiveWaitError",
    "check_collective",
    "collective_timeout",
    "debug_enabled",
    "default_backend",
    "default_device",
    "fake_world",
    "init",
    "set_debug",
    "shutdown",
]

log = logging.getLogger(__name__)

TIMEOUT_ENV = "MESHSHARD_TIMEOUT"
DEFAULT_TIMEOUT_S = 300.0


def collective_timeout(
    timeout: float | _dt.timedelta | None = None, *, environ: Mapping[str, str] | None = None
) -> _dt.timedelta:
    """How long a collective waits for the other ranks before it fails.

    Parameters
    ----------
    timeout : float (seconds) or timedelta, optional
        Wins when given.
    environ : mapping, optional
        Where to read ``MESHSHARD_TIMEOUT`` (seconds); default ``os.environ``.

    Returns
    -------
    timedelta
        ``timeout``, else ``MESHSHARD_TIMEOUT``, else :data:`DEFAULT_TIMEOUT_S` (5 minutes).

    Raises
    ------
    ValueError
        If the value is not a positive finite number of seconds (the message names where it
        came from).
    """
    source = "timeout"
    if timeout is None:
        raw = (os.environ if environ is None else environ).get(TIMEOUT_ENV, "").strip()
        if not raw:
            return _dt.timedelta(seconds=DEFAULT_TIMEOUT_S)
        source = TIMEOUT_ENV
        try:
            timeout = float(raw)
        except ValueError:
            msg = f"{TIMEOUT_ENV}={raw!r} must be a number of seconds, e.g. {TIMEOUT_ENV}=120"
            raise ValueError(msg) from None
    secs = timeout.total_seconds() if isinstance(timeout, _dt.timedelta) else float(timeout)
    if not (math.isfinite(secs) and secs > 0):
        msg = f"{source}={timeout!r} must be a positive, finite number of seconds"
        raise ValueError(msg)
    return _dt.timedelta(seconds=secs)


def _use_timeout_for_new_groups(timeout: _dt.timedelta) -> None:
    """Make ``timeout`` the default of groups created later in this process (``new_group``
    and DeviceMesh sub-groups, which torch otherwise gives its 30-minute default)."""
    from torch.distributed import distributed_c10d as c10d

    c10d.default_pg_timeout = timeout
    if getattr(c10d, "default_pg_nccl_timeout", None) is not None:
        c10d.default_pg_nccl_timeout = timeout


def _backend_env(backend: str) -> None:
    """Environment the backend reads at group creation so that a timeout ends the wait
    (only defaults: what the user set wins)."""
    if "nccl" in backend:
        # watchdog aborts a timed-out collective and ends the process (torch's default; a
        # cluster profile that turned it off would turn timeouts back into hangs)
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
        if debug_enabled():
            os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")


def _dump_stack_on_sigterm() -> None:
    """When torchrun stops the job after one rank failed, it sends SIGTERM to the others:
    print where each was (the rank that never arrived shows it) before the default action."""
    import faulthandler
    import signal
    import threading

    sigterm = getattr(signal, "SIGTERM", None)
    if (
        sigterm is None
        or not hasattr(faulthandler, "register")
        or threading.current_thread() is not threading.main_thread()
        or signal.getsignal(sigterm) is not signal.SIG_DFL
    ):
        return
    faulthandler.register(sigterm, file=sys.stderr, all_threads=True, chain=True)


def _end_blocked_on_signal() -> None:
    """SIGINT/SIGTERM end a rank blocked in a collective in seconds, not at the timeout
    (:mod:`meshshard.comm.signals`); a world of one has no such wait."""
    if dist.get_world_size() > 1:
        end_blocked_on_signal()


def init(
    backend: str | None = None, *, timeout: float | _dt.timedelta | None = None
) -> tuple[int, int]:
    """Initialise the default process group with meshshard's collective timeout.

    Under torchrun (``RANK`` in the environment) it joins torchrun's rendezvous; otherwise it
    makes a world of one (rank 0) on a free local port. Collective: every rank must call this.

    Parameters
    ----------
    backend : str, optional
        ``"gloo"``, ``"nccl"`` or a device map such as ``"cpu:gloo,cuda:nccl"``; default
        that map when CUDA is available (NCCL for device tensors, gloo for the few CPU
        tensors a script still moves, e.g. a loader's counts), else gloo. With NCCL in it,
        each rank takes GPU ``LOCAL_RANK`` and the group is bound to it (``device_id``).
    timeout : float (seconds) or timedelta, optional
        Collective timeout; default ``MESHSHARD_TIMEOUT``, else 5 minutes
        (:func:`collective_timeout`). Groups created later (a DeviceMesh's) get it too.

    Returns
    -------
    (rank, world_size)

    Raises
    ------
    ValueError
        If the timeout (argument or ``MESHSHARD_TIMEOUT``) is not a positive number.

    Notes
    -----
    Also prints every thread's Python stack to stderr when the process gets SIGTERM (how
    torchrun stops the other ranks after one failed), so the log shows where a stuck rank
    was; this is skipped when the script installed its own SIGTERM handler. With more than
    one rank, a SIGINT or SIGTERM whose Python handler cannot run because the main thread is
    blocked in a collective ends the process within seconds
    (:func:`meshshard.comm.signals.end_blocked_on_signal`; install the script's own handlers
    before ``init`` so they are covered too).
    """
    import torch

    td = collective_timeout(timeout)
    if dist.is_initialized():
        log.debug("meshshard.comm.process.init: already initialised; only the timeout is set")
        _use_timeout_for_new_groups(td)
        _end_blocked_on_signal()
        return dist.get_rank(), dist.get_world_size()
    if backend is None:
        backend = default_backend()
    set_debug(None)
    _backend_env(backend)
    _use_timeout_for_new_groups(td)
    job = launch()
    extra = {}
    if "nccl" in backend:
        dev = torch.device("cuda", job.local_rank if job.launched else 0)
        torch.cuda.set_device(dev)
        extra["device_id"] = dev
    if job.launched:
        dist.init_process_group(backend, timeout=td, **extra)
    else:  # plain `python script.py`: a world of one
        store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=td)
        dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=td,
                                **extra)
    _dump_stack_on_sigterm()
    _end_blocked_on_signal()
    return dist.get_rank(), dist.get_world_size()


def default_backend() -> str:
    """``"cpu:gloo,cuda:nccl"`` when CUDA is available (a group that serves device tensors
    through NCCL and the CPU tensors a script must still move through gloo), else ``"gloo"``."""
    import torch

    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def default_device() -> torch.device:
    """The device a script runs on when ``--device`` is not given: this rank's GPU
    (``LOCAL_RANK``) when CUDA is available, else the CPU."""
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", launch().local_rank % torch.cuda.device_count())
    return torch.device("cpu")


@contextlib.contextmanager
def fake_world(world_size: int, rank: int = 0) -> Iterator[None]:
    """This process as ``rank`` of a world of ``world_size`` over torch's fake process group
    (collectives return at once and move nothing: for placement checks on the meta device,
    :mod:`meshshard.testing.device_guard`, never for values). Destroyed on exit.

    Raises
    ------
    RuntimeError
        If a process group is initialised already in this process.
    """
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        msg = "fake_world: a process group is initialised already in this process"
        raise RuntimeError(msg)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def join_group(backend: str, host: str, port: int, rank: int, world_size: int, *,
               join_timeout: _dt.timedelta, timeout: _dt.timedelta) -> None:
    """Join a default process group through the TCP store at ``host:port`` (rank 0's side
    created by the caller), as :func:`meshshard.testing.run_ranks` starts its ranks.

    Ranks wait up to ``join_timeout`` for each other (on a loaded machine they start at
    different times); collectives then get ``timeout``, as do groups created later. A barrier
    ends the join, so every rank is fully connected before any can run and exit: once, on a
    loaded machine, a rank that returned at once left while its peer was still in gloo's
    ``connectFullMesh`` ("Connection closed by peer").
    """
    from torch.distributed import distributed_c10d as c10d

    _backend_env(backend)
    store = dist.TCPStore(host, port, world_size, is_master=False, timeout=join_timeout)
    set_later = hasattr(c10d, "_set_pg_timeout")
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=join_timeout if set_later else timeout)
    dist.barrier()
    if set_later:
        c10d._set_pg_timeout(timeout)
    _use_timeout_for_new_groups(timeout)


def shutdown(exit_code: int | None = None) -> None:
    """Tear the process groups down cleanly: a barrier, then every sub-group (DeviceMesh
    groups included), then the default group.

    With torch 2.13 and gloo, a process that holds more than one process group (which
    ``init_device_mesh`` creates) aborts at exit about half the time ("terminate called
    without an active exception") when the groups are left to the interpreter's teardown or
    destroyed all at once; destroying the sub-groups first after a barrier avoided it in
    every short trial here, yet the quickstart still aborted once in ~30 torchrun runs.
    Pass ``exit_code`` at the very end of a script to leave right after the teardown (stdio
    and logging flushed, then ``os._exit``), skipping the interpreter teardown where that
    abort happens. Collective: every rank must call this. A no-op when nothing is
    initialised (but ``exit_code`` still exits).
    """
    if dist.is_initialized():
        _destroy_groups()
    if exit_code is not None:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)


def _destroy_groups() -> None:
    check_collective("barrier", None, detail="meshshard.comm.process.shutdown")
    dist.barrier()
    from torch.distributed import distributed_c10d as c10d

    world = c10d._get_default_group()
    for pg in list(c10d._world.pg_map.keys()):
        if pg is not world:
            dist.destroy_process_group(pg)
    dist.destroy_process_group()
