"""Rank functions for tests/apps (module level, so the spawned ranks can import them)."""

from __future__ import annotations

import contextlib
import io

import numpy as np

N_POINTS = 2000


def model_and_data(n: int = N_POINTS, seed: int = 0):
    import torch

    from meshshard.models import Transolver

    torch.manual_seed(seed)
    model = Transolver(3, 7, 4, n_hidden=32, n_layers=3, heads=2, slices=16).eval()
    g = torch.Generator().manual_seed(seed + 1)
    coords = torch.randn(1, n, 3, generator=g) * torch.tensor([2.0, 1.0, 0.5])
    feats = torch.randn(1, n, 7, generator=g)
    return model, coords, feats


def chunked_rank(rank: int, world: int, layouts: list[list[int]], chunks: list[int]) -> dict:
    """For every layout (rows per rank) and chunk size: this rank's chunked output."""
    from meshshard.apps.chunked import chunked_forward

    out = {}
    for li, sizes in enumerate(layouts):
        model, coords, feats = model_and_data(sum(sizes))
        lo = sum(sizes[:rank])
        c = coords[:, lo : lo + sizes[rank]]
        f = feats[:, lo : lo + sizes[rank]]
        for ch in chunks:
            y = chunked_forward(model, (c, f), max_points_per_chunk=ch)
            out[(li, ch)] = y.numpy()
    return out


def cli_rank(rank: int, world: int, argvs: list[list[str]]) -> list[tuple]:
    """``meshshard ARGV`` for each of ``argvs`` on this rank: (exit code, stdout, stderr)."""
    from meshshard.cli import main

    out = []
    for argv in argvs:
        o, e = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
            rc = main(argv)
        out.append((rc, o.getvalue(), e.getvalue()))
    return out


def predict_rank(rank: int, world: int, ckpt: str, source: str, chunk: int | None) -> dict:
    """predict_rows on this rank's rows of ``source`` (chunked, or unchunked with None)."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.apps.inputs import read_surface_rows
    from meshshard.apps.model_file import load_model
    from meshshard.apps.predict import model_inputs, predict_rows

    mesh = init_device_mesh("cpu", (world,))
    rows = read_surface_rows(source, mesh.get_group())
    mf = load_model(ckpt)
    res, feats = {}, {}
    for ch in (chunk, None):
        res[ch] = predict_rows(mf, rows, mesh=mesh, max_points_per_chunk=ch)
        # the model's inputs: the streamed kNN features (chunk) against build_inputs (None)
        feats[ch] = [t.numpy() for t in model_inputs(rows, int(mf.inputs["knn"]), mesh, ch)]
    return {"perm": rows.perm, "pred": res, "sizes": rows.sizes, "inputs": feats}


def as_array(x) -> np.ndarray:
    return np.asarray(x)


def volume_rank(rank: int, world: int, ckpt: str, sources: list[str], chunk: int) -> dict:
    """For each source: this rank's volume rows (perm, sizes) and predictions chunked by
    ``chunk`` and unchunked (ShardTensor forward), and the inputs both ways."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.apps.model_file import load_model
    from meshshard.apps.volume import predict_volume_rows
    from meshshard.apps.volume_inputs import read_volume_rows, volume_inputs

    mesh = init_device_mesh("cpu", (world,))
    mf = load_model(ckpt)
    out = {}
    for src in sources:
        rows = read_volume_rows(src, mesh.get_group())
        res = {ch: predict_volume_rows(mf, rows, mesh=mesh, max_points_per_chunk=ch)
               for ch in (chunk, None)}
        inputs = {ch: [t.numpy() for t in volume_inputs(rows, mesh.get_group(), ch)]
                  for ch in (chunk, None)}
        out[src] = {"perm": rows.perm, "sizes": rows.sizes, "pred": res, "inputs": inputs}
    return out
