"""meshshard.pipelines._workers.WorkerPool on its own: a dead worker fails only its task, an
exception in the parent ends every worker (no waiting for running tasks)."""

from __future__ import annotations

import signal

import pytest

from meshshard.pipelines._workers import TaskError, WorkerDied, WorkerPool, describe_exit
from tests.pipelines._procfns import pid_then_sleep, square_or_die


def test_a_dead_worker_fails_only_its_task_and_is_replaced():
    exited = []
    with WorkerPool(2, on_exit=exited.append) as pool:
        got = dict(pool.imap_unordered(square_or_die, [(i,) for i in range(6)]))
    assert sorted(got) == list(range(6))
    assert {i: got[i] for i in (0, 3, 4, 5)} == {0: 0, 3: 9, 4: 16, 5: 25}
    assert isinstance(got[1], WorkerDied) and got[1].exitcode == -9
    assert "died from SIGKILL (killed from outside; often the out-of-memory killer" in (
        got[1].message
    )
    assert exited == [got[1].pid]
    assert isinstance(got[2], TaskError) and str(got[2]) == "SystemExit: not an Exception"


def test_an_exception_in_the_parent_kills_busy_workers():
    """An interrupt while both workers run a 10-minute task: the pool kills them at once."""
    pool = WorkerPool(2, grace=1.0)
    procs = []

    def interrupt(signum, frame):
        busy = [w for w in pool._workers if w.task is not None]
        if len(busy) < 2:  # not both started yet: look again shortly
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            return
        procs.extend(w.proc for w in busy)
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    try:
        with pytest.raises(KeyboardInterrupt), pool:
            for _ in pool.imap_unordered(pid_then_sleep, [(0,), (1,)]):
                pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert len(procs) == 2
    assert all(not p.is_alive() for p in procs)
    assert all(p.exitcode == -signal.SIGTERM for p in procs)  # SIGTERM sufficed
    assert pool._workers == []


def test_describe_exit():
    assert describe_exit(7, -11).startswith("the worker process (pid 7) died from SIGSEGV (")
    assert describe_exit(7, 3) == "the worker process (pid 7) exited with status 3"
