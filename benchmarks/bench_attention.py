"""Ring attention: one fwd+bwd step of ``F.scaled_dot_product_attention`` over N point tokens
(B=1, 4 heads, head dim 64, fp32), one process (torch's own CPU flash SDPA, 1 and 2 threads)
against 2 and 4 gloo ranks (1 thread each) on token-sharded ShardTensors.

Every configuration runs in freshly spawned processes; each rank resets its resident-memory
high-water mark (``/proc/self/clear_refs``) just before the step and reads ``VmHWM`` after it.
Reported per configuration:

- ``wall s``: step time (slowest rank; ranks start together after a barrier);
- ``cpu s``: CPU seconds of the step summed over the ranks (and their threads) -- on a shared
  machine the wall time is noisy, the CPU time less so;
- ``peak MiB``: per-rank peak RSS growth during the step over the RSS just before it (inputs
  are allocated before), the largest over the ranks; and ``rss MiB``: the largest total peak RSS;
- ``sent MiB``: bytes each rank sent through the ring (measured by
  ``meshshard.comm.ring``);
- with ``--live``, ``live MiB``: peak bytes of tensor storages allocated during a second, identical
  step and alive at once, tracked exactly by a dispatch mode (storages an op output does not share
  with its inputs count from their creation until they are freed). It does not see buffers that a
  kernel allocates and frees inside itself, nor heap the allocator keeps: RSS growth is the real
  memory, this column says how much of it is live tensors.

Targets (issue 12): at >= 32k tokens, per-rank peak attention memory <= 1.25/P of one process,
and 2 ranks <= 0.65x the one-process (1 thread) step time.

    python benchmarks/bench_attention.py                          # 8k, 32k
    python benchmarks/bench_attention.py --tokens 8192 --configs 1x1,2x1
    python benchmarks/bench_attention.py --tokens 131072 --configs 2x1,4x1   # long
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from meshshard.testing import run_ranks
from meshshard.testing.memory import peak_rss_bytes, reset_peak_rss, rss_bytes

HEADS, HEAD_DIM = 4, 64


def _inputs(n_local: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, HEADS, n_local, HEAD_DIM, generator=g) for _ in range(4)]


class _LiveBytes(TorchDispatchMode):
    """Peak bytes of tensor storages created under the mode and alive at the same time."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict = {}
        self.cur = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:
            self.cur -= self.live.pop(key)[1]
        seen = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            key = st.data_ptr()
            if key and key not in seen and key not in self.live:
                self.live[key] = (StorageWeakRef(st), st.nbytes())
                self.cur += st.nbytes()
        self.peak = max(self.peak, self.cur)
        return out


def _one_step(mesh, sizes, rank) -> None:
    import torch.nn.functional as F

    from meshshard.shardtensor import Shard, from_local

    q, k, v, g = _inputs(sizes[rank], seed=rank)
    for t in (q, k, v):
        t.requires_grad_(True)
    if mesh is None:
        F.scaled_dot_product_attention(q, k, v).backward(g)
        return
    qs, ks, vs = (from_local(t, mesh, [Shard(2)], sizes, validate=False) for t in (q, k, v))
    F.scaled_dot_product_attention(qs, ks, vs).to_local().backward(g)


def step(rank, world_size, n, threads, live=False):
    """One fwd+bwd step on this rank's share of ``n`` tokens; returns its measurements."""
    import torch.distributed as dist
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    from meshshard.comm.ring import bytes_sent, reset_bytes_sent
    from meshshard.shardtensor import Shard, even_sizes, from_local

    mesh = None
    if world_size > 1:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (world_size,))
    _one_step(mesh, even_sizes(64 * world_size, world_size), rank)  # warm-up: first-call costs
    sizes = even_sizes(n, world_size)
    q, k, v, g = _inputs(sizes[rank], seed=rank)
    for t in (q, k, v):
        t.requires_grad_(True)
    if world_size > 1:
        qs, ks, vs = (from_local(t, mesh, [Shard(2)], sizes, validate=False) for t in (q, k, v))
        dist.barrier()
    reset_bytes_sent()
    reset_peak_rss()
    rss0 = rss_bytes() / 2**20
    t0, c0 = time.perf_counter(), time.process_time()
    if world_size > 1:
        out = F.scaled_dot_product_attention(qs, ks, vs).to_local()
    else:
        out = F.scaled_dot_product_attention(q, k, v)
    out.backward(g)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if world_size > 1:
        dist.barrier()
    assert q.grad is not None and k.grad is not None and v.grad is not None
    high = peak_rss_bytes() / 2**20
    res = {"wall": wall, "cpu": cpu, "peak": high - rss0, "rss": high,
           "sent": bytes_sent() / 2**20, "live": float("nan")}
    if live:  # the same step again, its tensors tracked (after the RSS step: no effect on it)
        del out
        for t in (q, k, v):
            t.grad = None
        mode = _LiveBytes()
        with mode:
            if world_size > 1:
                out = F.scaled_dot_product_attention(qs, ks, vs).to_local()
            else:
                out = F.scaled_dot_product_attention(q, k, v)
            out.backward(g)
        res["live"] = mode.peak / 2**20
    return res


def run(n: int, ranks: int, threads: int, live: bool = False) -> dict:
    res = run_ranks(step, ranks, n, threads, live, threads=threads, timeout=3600)
    return {"wall": max(r["wall"] for r in res), "cpu": sum(r["cpu"] for r in res),
            "peak": max(r["peak"] for r in res), "rss": max(r["rss"] for r in res),
            "sent": max(r["sent"] for r in res), "live": max(r["live"] for r in res)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="8192,32768", help="comma-separated token counts")
    ap.add_argument("--configs", default="1x1,1x2,2x1,4x1",
                    help="ranks x threads per rank, comma-separated")
    ap.add_argument("--live", action="store_true",
                    help="add peak live tensor MiB per rank (a second step, tracked)")
    a = ap.parse_args(argv)
    configs = [tuple(int(v) for v in c.split("x")) for c in a.configs.split(",")]
    print(f"torch {torch.__version__}, {os.cpu_count()} cpus; B=1 H={HEADS} E={HEAD_DIM} fp32")
    print(f"{'tokens':>7} {'config':>14} {'wall s':>8} {'cpu s':>8} {'peak MiB':>9} "
          f"{'rss MiB':>8} {'sent MiB':>9} {'wall/1p1t':>9} {'peak/1p1t':>9}"
          + (f" {'live MiB':>9} {'live/1p1t':>9}" if a.live else ""))
    for n in (int(float(t)) for t in a.tokens.split(",")):
        base = None
        for ranks, threads in configs:
            r = run(n, ranks, threads, a.live)
            if (ranks, threads) == (1, 1):
                base = r
            name = f"{ranks} rank{'s' if ranks > 1 else ''} x {threads}t"
            rw = f"{r['wall'] / base['wall']:.2f}" if base else "-"
            rp = f"{r['peak'] / base['peak']:.2f}" if base else "-"
            rl = f"{r['live'] / base['live']:.2f}" if base else "-"
            tail = f" {r['live']:>9.1f} {rl:>9}" if a.live else ""
            print(f"{n:>7} {name:>14} {r['wall']:>8.2f} {r['cpu']:>8.2f} {r['peak']:>9.1f} "
                  f"{r['rss']:>8.0f} {r['sent']:>9.1f} {rw:>9} {rp:>9}{tail}", flush=True)


if __name__ == "__main__":
    main()
