"""Custom autograd Functions and register_hook on ShardTensors are exact (they used to be cut
from the graph silently: Function.apply never calls __torch_function__). That torch is left
unpatched: ``test_autograd.py``."""

import pytest
import torch

from meshshard.testing import run_ranks
from tests.shardtensor import _function_fns


@pytest.mark.parametrize("sizes", [(3, 5), (0, 8)])
def test_custom_functions_and_hooks_match_single_process(sizes):
    reports = run_ranks(_function_fns.functions_vs_single, 2, sizes, timeout=120)
    for rank, rep in enumerate(reports):
        assert rep["loss"][0] == pytest.approx(rep["loss"][1], rel=1e-6)
        for key in ("gx", "gw"):
            got, want = rep[key]
            assert got is not None, f"rank {rank}: gradient {key} was dropped"
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert rep["hook"] == ["ShardTensor"]  # the hook ran once, on the ShardTensor grad
        assert "returned a plain tensor" in rep["bad"] and "ShardTensor input" in rep["bad"]


def test_plain_functions_unchanged():
    x = torch.randn(1, 5, 4, requires_grad=True)
    w = torch.randn(4, requires_grad=True)
    _function_fns._loss(x, w).backward()
    assert x.grad is not None and w.grad is not None
