"""Rank functions and shared case data for tests/partition/test_distributed.py (module level so
spawned ranks can import them)."""

from __future__ import annotations

import datetime
import time

import numpy as np


def case_data(case: dict) -> tuple[np.ndarray, np.ndarray | None]:
    """The full (concatenated) points and weights of a case."""
    rng = np.random.default_rng(case.get("seed", 0))
    n = int(sum(case["layout"]))
    dim = case.get("dim", 3)
    kind = case.get("kind", "uniform")
    dtype = np.dtype(case.get("dtype", "float32"))
    if kind == "grid":  # many equal coordinates and exact ties at every cut
        pts = rng.integers(0, 6, size=(n, dim)).astype(dtype)
    elif kind == "dupes":
        pts = rng.random((n, dim)).astype(dtype)
        pts[n // 4 : n // 4 + n // 3] = pts[0]
        pts[-n // 5 :] = pts[1]
    elif kind == "clustered":
        c = rng.random((5, dim))
        pts = (c[rng.integers(0, 5, n)] + 0.02 * rng.standard_normal((n, dim))).astype(dtype)
    else:
        pts = rng.random((n, dim)).astype(dtype)
    w = None
    if case.get("weighted"):
        w = rng.integers(0, 8, n).astype(np.float64) * 0.25  # dyadic: exact prefix sums
    return pts, w


def _slice(case: dict, rank: int) -> slice:
    off = int(sum(case["layout"][:rank]))
    return slice(off, off + int(case["layout"][rank]))


def partition_cases(rank: int, world: int, cases: list[dict]) -> list[dict]:
    """Run every case on this rank: partition, redistribute, radius halo."""
    from meshshard.partition.distributed import (
        _rcb,
        _select,
        _sfc,
        _sfc_device,
        halo_plan_graph_distributed,
        halo_plan_radius_distributed,
        partition_distributed,
        redistribute_rows,
    )

    out = []
    for case in cases:
        pts, w = case_data(case)
        sl = _slice(case, rank)
        _select.GATHER_MAX = case.get("gather_max", 8192)
        _rcb.PACK_BITS = _sfc.PACK_BITS = 0 if case.get("no_pack") else 63
        _sfc.TORCH_KEYS = bool(case.get("torch_keys"))  # the device (torch) key path, on CPU
        _sfc_device.DEVICE_PATH = bool(case.get("device_path"))  # the whole torch path, on CPU
        parts = case.get("parts", world)
        group, local = None, pts[sl]
        if case.get("mesh"):  # a 1-D DeviceMesh instead of a process group
            from torch.distributed.device_mesh import init_device_mesh

            group = init_device_mesh("cpu", (world,))
        if case.get("torch"):  # torch tensors in, same answer
            import torch

            local = torch.from_numpy(local.copy())
        dp = partition_distributed(
            local, parts, group, case["method"],
            weights=None if w is None else w[sl], targets=case.get("targets"),
            allow_empty=case.get("allow_empty", False),
        )  # fmt: skip
        gidx = np.arange(sl.start, sl.stop, dtype=np.int64)
        fields = {"x": pts[sl], "f": (pts[sl, :2] * 3).astype(np.float16), "row": gidx}
        moved = redistribute_rows(fields, dp, budget_bytes=case.get("budget", 1 << 20))
        res = {
            "dest": dp.dest, "position": dp.position, "order": dp.order, "sizes": dp.sizes,
            "moved": moved, "owned": dp.owned_rows,
        }  # fmt: skip
        if "r" in case and parts == world:
            piece = halo_plan_radius_distributed(dp, moved["x"], case["r"])
            res["halo"] = (piece.send_ptr, piece.send_idx, piece.recv_ptr, piece.recv_idx)
        if "rings" in case and parts == world:
            from meshshard.partition import knn_graph

            graph = knn_graph(pts, 6).tocsr()[sl]  # this rank's rows only
            piece = halo_plan_graph_distributed(dp, graph, case["rings"])
            res["ring"] = (piece.send_ptr, piece.send_idx, piece.recv_ptr, piece.recv_idx)
        out.append(res)
    return out


def bad_input(rank: int, world: int, kind: str) -> tuple[str, str]:
    """Return (exception type, message) of what partition_distributed raised on this rank."""
    import torch.distributed as dist

    from meshshard.partition import distributed as pd

    rng = np.random.default_rng(rank)
    pts = rng.random((50, 3)).astype(np.float32)
    group = None
    if kind == "dims" and rank == 1:
        pts = pts[:, :2].copy()
    elif kind == "dtype" and rank == 1:
        pts = pts.astype(np.float64)
    elif kind in ("nan", "nan_device") and rank == world - 1:
        pts[7, 1] = np.nan
    elif kind == "parts" and rank == 0:
        pass
    elif kind == "fault":
        group = dist.new_group(timeout=datetime.timedelta(seconds=3))
        if rank == 1:
            pd._FAULT.update(phase="exchange", rank=1)
    if kind == "nan_device":  # checked by the device (torch) path
        import torch

        from meshshard.partition.distributed import _sfc_device

        _sfc_device.DEVICE_PATH = True
        pts = torch.from_numpy(pts)
    parts = world + 1 if kind == "parts" and rank == 0 else world
    t0 = time.monotonic()
    try:
        dp = pd.partition_distributed(pts, parts, group, "hilbert")
        if kind == "rows":  # one rank passes a field with the wrong number of rows
            f = np.zeros((49 if rank == 1 else 50, 2), dtype=np.float32)
            pd.redistribute_rows({"f": f}, dp)
    except Exception as exc:  # the test inspects it
        if kind == "fault" and rank == 1:
            time.sleep(6)  # stay alive (no closed sockets): the others must time out
        return type(exc).__name__, f"{exc} [after {time.monotonic() - t0:.1f} s]"
    return "none", ""


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak() -> None:
    """Reset VmHWM to the current RSS (Linux clear_refs "5"); if that fails the measured
    growth is an over-estimate, which only makes the budget test stricter."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def memory_case(rank: int, world: int, n_local: int, method: str) -> dict:
    """Peak RSS growth (kB) and exchange bytes of partition_distributed on an even split."""
    from meshshard.partition.distributed import partition_distributed

    pts = np.random.default_rng(rank).random((n_local, 3)).astype(np.float32)
    _reset_peak()
    before = _status_kb("VmRSS")
    dp = partition_distributed(pts, world, None, method)
    after = _status_kb("VmHWM")
    return {
        "rss_growth_bytes": (after - before) * 1024,
        "peak_buffer": dp.peak_buffer,
        "exchange_bytes": sum(dp.exchange_bytes.values()),
    }
