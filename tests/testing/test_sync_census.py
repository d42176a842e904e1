"""The host-sync census counts exactly the syncs a toy function makes, attributes each to its
meshshard line, nests, and restores the patched Tensor methods."""

from __future__ import annotations

import inspect

import numpy as np
import torch

from meshshard.testing.sync_census import sync_census


def _toy(x: torch.Tensor) -> torch.Tensor:
    n = int((x > 2).sum())  # item
    a = x[x > 2]  # bool_index
    b = torch.nonzero(x)  # nonzero
    c = torch.unique(x.round())  # unique
    lst = x.tolist()  # tolist
    arr = x.numpy()  # numpy
    h = torch.tensor([1.0, 2.0])  # host_tensor
    f = torch.from_numpy(np.arange(3))  # host_tensor
    s = bool(x.any())  # item
    ri = torch.repeat_interleave(torch.arange(3), torch.ones(3, dtype=torch.long))  # r_i
    ok = torch.repeat_interleave(torch.arange(3), torch.ones(3, dtype=torch.long), output_size=3)
    quiet = x.sort().values.cumsum(0) + x.max() + torch.zeros(3).sum()  # none of these
    return a.sum() + b.sum() + c.sum() + n + len(lst) + arr.size + h.sum() + f.sum() + s \
        + ri.sum() + ok.sum() + quiet.sum()


def test_toy_function_counts_each_sync_once():
    x = torch.arange(6.0)
    with sync_census() as c:
        _toy(x)
    assert c.by_kind() == {
        "item": 2,
        "host_tensor": 2,
        "bool_index": 1,
        "nonzero": 1,
        "unique": 1,
        "tolist": 1,
        "numpy": 1,
        "repeat_interleave": 1,
    }, c.report()
    assert c.total == 10
    # the toy lives outside meshshard: every event is attributed to "<outside>"
    assert c.by_line() == {"<outside>": 10}


def test_attribution_to_meshshard_line_and_nesting():
    from meshshard.ops import kernels

    x = torch.rand(20, 3, dtype=torch.float64)
    with sync_census() as outer:
        with sync_census() as inner:
            float(x.sum())
        kernels._radius_brute(x, x, 0.3)
    assert inner.total == 1
    # one tile: one nonzero, attributed to the line of kernels.py that calls it
    src, first = inspect.getsourcelines(kernels._radius_brute)
    line = first + next(i for i, s in enumerate(src) if "torch.nonzero" in s)
    want = {"<outside>": 1, f"meshshard/ops/kernels.py:{line}": 1}
    assert outer.by_line() == want, outer.report()
    assert outer.by_line() == want, outer.report()
    assert outer.count("nonzero", "kernels.py") == 1


def test_methods_restored_and_quiet_outside():
    orig = torch.Tensor.tolist
    with sync_census() as c:
        assert torch.Tensor.tolist is not orig
    assert torch.Tensor.tolist is orig
    torch.arange(3).tolist()
    float(torch.ones(()))
    assert c.total == 0
