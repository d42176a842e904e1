"""Host syncs of one warm training step, counted by :mod:`meshshard.testing.sync_census` on 2
gloo ranks (the number a GPU step would stall for): MeshGraphNet (4 layers) through GraphPlug,
and DoMINO on ShardTensors (slab grid), with the kNN kernel a GPU runs (the cell list) and with
the CPU's (cKDTree)."""

from __future__ import annotations

import re

from meshshard.testing import run_ranks
from tests.models._step_sync_fns import all_steps

MGN_TARGET = 8
DOMINO_TARGET = 24
# DoMINO with the CPU's default kNN kernel (cKDTree, host arrays): a ceiling so it cannot grow
DOMINO_CPU_CEILING = 60
_OUT: list = []


def _results() -> dict:
    if not _OUT:
        _OUT.extend(run_ranks(all_steps, 2, timeout=600))
    return _OUT


def _own_lines(report: str) -> int:
    """Syncs made by DoMINO's own code (model, its ops object, grid layout and sampling), not
    by the neighbour ops it calls."""
    own = ("models/domino.py", "ops/domino_ops.py", "ops/gridpoint.py", "ops/gridsample.py")
    return sum(int(m.group(1)) for m in re.finditer(r"^\s*(\d+)\s+meshshard/(\S+?):", report,
                                                    re.M) if m.group(2).endswith(own))


def test_meshgraphnet_plug_step():
    for rank, res in enumerate(_results()):
        total, report = res["meshgraphnet_plug"]
        assert total <= MGN_TARGET, f"rank {rank}: {report}"


def test_domino_own_code_syncs_once_or_not_at_all():
    """The model and its ops read back only the grid sampling's routing counts (and, when it
    validates, the cover check's verdict)."""
    for rank, res in enumerate(_results()):
        total, report = res["domino"]
        assert _own_lines(report) <= 1, f"rank {rank}: {report}"
        total_v, report_v = res["domino_validated"]
        assert _own_lines(report_v) <= 2 and total_v >= total, f"rank {rank}: {report_v}"


def test_domino_step():
    """On the device path (the kNN's cell list, the default off the CPU), validation off as
    the training loop runs it (its loader checked the samples)."""
    for rank, res in enumerate(_results()):
        total, report = res["domino"]
        assert total <= DOMINO_TARGET, f"rank {rank}: {report}"


def test_domino_step_with_cpu_kernels_stays_under_its_ceiling():
    for rank, res in enumerate(_results()):
        total, report = res["domino_cpu_kernels"]
        assert total <= DOMINO_CPU_CEILING, f"rank {rank}: {report}"


def test_domino_gathered_search_step_has_no_host_sync():
    """The static-shape search (points, features and grid all-gathered by their layouts'
    sizes, the brute-force kernel): nothing is read back."""
    for rank, res in enumerate(_results()):
        total, report = res["domino_gathered"]
        assert total == 0, f"rank {rank}: {report}"


def test_meshgraphnet_ghost_exchange_step():
    """GhostExchange: the collective input check of ``begin`` is the step's only read-back
    (its flag built on the host and its verdict); ``validate="never"`` has none."""
    for rank, res in enumerate(_results()):
        total, report = res["meshgraphnet_ghost"]
        assert 1 <= total <= 2, f"rank {rank}: {report}"
        total, report = res["meshgraphnet_ghost_unchecked"]
        assert total == 0, f"rank {rank}: {report}"
