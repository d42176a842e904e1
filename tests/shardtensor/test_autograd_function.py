"""Custom autograd Functions and register_hook on ShardTensors are exact (they used to be cut
from the graph silently: Function.apply never calls __torch_function__)."""

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


def test_import_changes_nothing_in_torch_until_a_shardtensor_exists():
    # STYLE: nothing configures the process on import. A fresh interpreter, so that no other
    # test's ShardTensor installed the bridge already.
    import subprocess
    import sys

    code = (
        "import torch\n"
        "orig = torch.autograd.Function.apply\n"
        "import meshshard.shardtensor as st, meshshard.models, meshshard.parallel\n"
        "assert torch.autograd.Function.apply == orig, 'patched on import'\n"
        "from meshshard.shardtensor.spec import ShardSpec\n"
        "st.ShardTensor(torch.zeros(2), ShardSpec(None, (st.Replicate(),), (None,), "
        "torch.Size([2])))\n"
        "assert torch.autograd.Function.apply != orig, 'not installed by the first ShardTensor'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
