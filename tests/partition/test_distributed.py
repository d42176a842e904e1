"""partition_distributed, redistribute_rows and distributed radius halos against the
single-process partition() and halo_plan_radius() on the concatenated points (real gloo ranks)."""

from __future__ import annotations

import numpy as np
import pytest

from meshshard.partition import partition
from meshshard.partition.halo import halo_plan_radius
from meshshard.testing.distributed import run_ranks
from tests.partition._dist_fns import bad_input, case_data, memory_case, partition_cases

CASES = {
    2: [
        {"layout": [300, 500], "method": "hilbert", "r": 0.12, "rings": 1},
        {"layout": [0, 800], "method": "morton", "r": 0.12, "rings": 2},
        {"layout": [3, 5], "method": "rcb"},
        {"layout": [700, 0], "method": "rcb", "kind": "dupes", "r": 0.1, "gather_max": 40},
        {"layout": [400, 700], "method": "rcb", "weighted": True, "gather_max": 40},
        {"layout": [500, 600], "method": "hilbert", "weighted": True, "budget": 700},
        {"layout": [250, 250], "method": "hilbert", "parts": 5, "targets": [0.1, 0.3, 0, 0.4, 0.2]},
        {"layout": [2, 1], "method": "morton", "parts": 5, "allow_empty": True},
        {"layout": [600, 300], "method": "rcb", "kind": "grid", "gather_max": 30, "r": 1.0},
        {"layout": [400, 400], "method": "hilbert", "dim": 2, "dtype": "float64", "r": 0.05},
        {"layout": [90, 10], "method": "morton", "mesh": True, "torch": True},
        {"layout": [300, 400], "method": "hilbert", "torch": True, "torch_keys": True},
        {"layout": [500, 0], "method": "rcb", "torch": True, "torch_keys": True, "kind": "dupes"},
        {"layout": [0, 0], "method": "hilbert", "parts": 3, "allow_empty": True},
        {"layout": [300, 400], "method": "hilbert", "torch": True, "device_path": True,
         "kind": "dupes", "r": 0.1},
        {"layout": [0, 800], "method": "morton", "torch": True, "device_path": True,
         "dim": 2, "dtype": "float64"},
        {"layout": [2, 1], "method": "hilbert", "parts": 5, "allow_empty": True,
         "torch": True, "device_path": True},
    ],
    3: [
        {"layout": [100, 0, 900], "method": "hilbert", "kind": "dupes", "r": 0.1, "rings": 2},
        {
            "layout": [333, 333, 334],
            "method": "rcb",
            "kind": "clustered",
            "gather_max": 50,
            "r": 0.03,
        },
        {"layout": [0, 1000, 0], "method": "morton", "kind": "grid", "budget": 100},
        {
            "layout": [500, 200, 300],
            "method": "rcb",
            "weighted": True,
            "parts": 7,
            "gather_max": 20,
        },
        {"layout": [100, 0, 900], "method": "hilbert", "torch": True, "device_path": True,
         "kind": "clustered", "rings": 1},
    ],
    4: [
        {"layout": [1, 1, 6, 992], "method": "hilbert", "r": 0.1, "rings": 3},
        {"layout": [200, 300, 0, 500], "method": "hilbert", "kind": "dupes", "no_pack": True},
        {"layout": [200, 300, 0, 500], "method": "rcb", "kind": "grid", "no_pack": True},
        {"layout": [0, 0, 0, 1200], "method": "rcb", "gather_max": 64, "r": 0.1, "rings": 1},
        {"layout": [300, 0, 300, 300], "method": "morton", "kind": "dupes", "weighted": True},
        {
            "layout": [250, 250, 250, 250],
            "method": "rcb",
            "kind": "grid",
            "dim": 2,
            "gather_max": 16,
            "targets": [0.4, 0.2, 0.2, 0.2],
        },
        {"layout": [10, 20, 30, 40], "method": "hilbert", "parts": 2, "r": 0.2},
        {"layout": [1, 1, 6, 992], "method": "morton", "torch": True, "device_path": True,
         "parts": 7, "targets": [0.1, 0.2, 0, 0.3, 0.1, 0.2, 0.1]},
        {"layout": [200, 300, 0, 500], "method": "hilbert", "torch": True,
         "device_path": True, "kind": "grid", "r": 1.0},
    ],
}

_RESULTS: dict[int, list] = {}


def _results(P: int) -> list:
    if P not in _RESULTS:
        _RESULTS[P] = run_ranks(partition_cases, P, CASES[P], timeout=300)
    return _RESULTS[P]


def _reference(case: dict, world: int):
    pts, w = case_data(case)
    ref = partition(
        pts, case.get("parts", world), case["method"], weights=w, targets=case.get("targets"),
        allow_empty=case.get("allow_empty", False),
    )  # fmt: skip
    return pts, ref


IDS = [(P, i) for P, cs in CASES.items() for i in range(len(cs))]


@pytest.mark.parametrize(("P", "ci"), IDS)
def test_partition_equals_single_process(P: int, ci: int) -> None:
    case = CASES[P][ci]
    per_rank = [r[ci] for r in _results(P)]
    pts, ref = _reference(case, P)
    dest = np.concatenate([r["dest"] for r in per_rank])
    order = np.concatenate([r["order"] for r in per_rank])
    np.testing.assert_array_equal(dest, ref.assignment, err_msg=f"case {case}")
    np.testing.assert_array_equal(order, ref.order, err_msg=f"case {case}")
    for r in per_rank:
        np.testing.assert_array_equal(r["sizes"], ref.sizes)
    stored = np.concatenate([ref.offsets[r["dest"]] + r["position"] for r in per_rank])
    np.testing.assert_array_equal(stored, ref.inverse)


@pytest.mark.parametrize(("P", "ci"), IDS)
def test_redistributed_rows_are_in_stored_order(P: int, ci: int) -> None:
    case = CASES[P][ci]
    per_rank = [r[ci] for r in _results(P)]
    pts, ref = _reference(case, P)
    x = np.concatenate([r["moved"]["x"] for r in per_rank])
    f = np.concatenate([r["moved"]["f"] for r in per_rank])
    rows = np.concatenate([r["moved"]["row"] for r in per_rank])
    np.testing.assert_array_equal(rows, ref.order)
    np.testing.assert_array_equal(x, ref.apply(pts))
    np.testing.assert_array_equal(f, ref.apply((pts[:, :2] * 3).astype(np.float16)))
    assert [r["owned"] for r in per_rank][-1][1] == pts.shape[0]


HALO_IDS = [(P, i) for P, i in IDS if "r" in CASES[P][i] and CASES[P][i].get("parts", P) == P]


@pytest.mark.parametrize(("P", "ci"), HALO_IDS)
def test_radius_halo_equals_single_process(P: int, ci: int) -> None:
    case = CASES[P][ci]
    per_rank = [r[ci] for r in _results(P)]
    pts, ref = _reference(case, P)
    plan = halo_plan_radius(ref, pts, case["r"])
    assert plan.halo_sizes().sum() > 0, "case too easy: no halo at all"
    for p, r in enumerate(per_rank):
        send_ptr, send_idx, recv_ptr, recv_idx = r["halo"]
        np.testing.assert_array_equal(send_ptr, plan.send_ptr[p])
        np.testing.assert_array_equal(send_idx, plan.send_idx[p])
        np.testing.assert_array_equal(recv_ptr, plan.recv_ptr[p])
        np.testing.assert_array_equal(recv_idx, plan.recv_idx[p])


RING_IDS = [(P, i) for P, i in IDS if "rings" in CASES[P][i]]


@pytest.mark.parametrize(("P", "ci"), RING_IDS)
def test_graph_halo_equals_single_process(P: int, ci: int) -> None:
    from meshshard.partition import knn_graph
    from meshshard.partition.halo import halo_plan_graph

    case = CASES[P][ci]
    per_rank = [r[ci] for r in _results(P)]
    pts, ref = _reference(case, P)
    plan = halo_plan_graph(ref, knn_graph(pts, 6), case["rings"])
    assert plan.halo_sizes().sum() > 0
    for p, r in enumerate(per_rank):
        send_ptr, send_idx, recv_ptr, recv_idx = r["ring"]
        np.testing.assert_array_equal(send_ptr, plan.send_ptr[p])
        np.testing.assert_array_equal(send_idx, plan.send_idx[p])
        np.testing.assert_array_equal(recv_ptr, plan.recv_ptr[p])
        np.testing.assert_array_equal(recv_idx, plan.recv_idx[p])


@pytest.mark.parametrize(
    ("kind", "etype", "needle"),
    [
        ("dims", "ValueError", "disagree on point dimension"),
        ("dtype", "ValueError", "disagree on points dtype"),
        ("nan", "ValueError", "invalid input on rank(s) [2]"),
        ("nan_device", "ValueError", "invalid input on rank(s) [2]"),
        ("parts", "ValueError", "disagree on parts"),
        ("rows", "ValueError", "redistribute_rows: wrong row count on rank(s) [1]"),
    ],
)
def test_bad_input_raises_on_every_rank(kind: str, etype: str, needle: str) -> None:
    got = run_ranks(bad_input, 3, kind, timeout=60)
    for rank, (name, text) in enumerate(got):
        assert name == etype, (rank, name, text)
        assert needle in text, (rank, text)
    assert "NaN" in got[2][1] if kind.startswith("nan") else True


def test_rank_failing_mid_exchange_ends_every_rank() -> None:
    """Rank 1 raises after the input agreement and stays alive; ranks 0 and 2 must end with an
    ExchangeError from the group's 3 s timeout instead of hanging (run_ranks would kill a hung
    rank at 60 s and report it)."""
    got = run_ranks(bad_input, 3, "fault", timeout=60)
    assert got[1][0] == "RuntimeError" and "injected fault" in got[1][1]
    for rank in (0, 2):
        assert got[rank][0] == "ExchangeError", got[rank]
        assert "phase" in got[rank][1]


# Stated budget, for an evenly split input on 4 ranks: each further local row may raise a
# rank's resident-set high-water mark by at most BYTES_PER_ROW (slope between 100k and 400k rows
# per rank; measured ~21 for Hilbert (int32 index arrays, packed keys) and ~41 for RCB; a
# gather of all N points or one int64 per global row would add >= 32 per local row), and no
# single collective may hold more than BUFFER_PER_ROW bytes per local row in its send + receive
# buffers (measured 16 for both).
BYTES_PER_ROW = {"hilbert": 40, "rcb": 64}
BUFFER_PER_ROW = {"hilbert": 24, "rcb": 24}


@pytest.mark.parametrize("method", ["hilbert", "rcb"])
def test_memory_within_budget_on_even_split(method: str) -> None:
    small, large = 100_000, 400_000
    a = run_ranks(memory_case, 4, small, method, timeout=300)
    b = run_ranks(memory_case, 4, large, method, timeout=300)
    for ra, rb in zip(a, b):
        assert rb["peak_buffer"] <= BUFFER_PER_ROW[method] * large, rb
        slope = (rb["rss_growth_bytes"] - ra["rss_growth_bytes"]) / (large - small)
        assert slope <= BYTES_PER_ROW[method], (slope, ra, rb)


def test_partition_package_does_not_import_torch_distributed() -> None:
    """Only meshshard.partition.distributed may use torch.distributed (DESIGN.md)."""
    import subprocess
    import sys

    code = (
        "import sys, meshshard.partition as p, numpy as np\n"
        "p.partition(np.random.default_rng(0).random((50, 3)), 2, 'rcb')\n"
        "assert 'torch.distributed' not in sys.modules, 'partition imported torch.distributed'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("dim", [2, 3])
@pytest.mark.parametrize("method", ["morton", "hilbert"])
def test_torch_keys_equal_numpy_codes(dim: int, method: str) -> None:
    """The device key path (torch) gives the numpy encoder's codes bit for bit."""
    import torch

    from meshshard.partition.distributed._keys import torch_codes
    from meshshard.partition.sfc import _ENCODERS, _MAX_BITS, _encode, bounding_box

    rng = np.random.default_rng(dim)
    p = (rng.random((3000, dim)) * 7 - 3).astype(np.float32)
    p[:200] = p[0]
    lo, hi = bounding_box(p)
    for bits in (1, 5, 12, _MAX_BITS[dim]):
        want = _encode(p, bits, _ENCODERS[method], bounds=(lo, hi)).view(np.int64)
        got = torch_codes(torch.from_numpy(p), bits, method, lo, hi).numpy()
        np.testing.assert_array_equal(got, want, err_msg=f"bits={bits}")
