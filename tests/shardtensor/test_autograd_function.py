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


def test_importing_or_using_shardtensor_changes_nothing_in_torch():
    # STYLE: nothing configures the process on import, and (the new core) nothing is patched on
    # use either: autograd lives on the wrapper. A fresh interpreter with a 1-rank gloo group.
    import subprocess
    import sys

    code = (
        "import torch, torch.distributed as dist\n"
        "names = ('autograd.Function.apply', 'Tensor.backward', 'autograd.backward', "
        "'autograd.grad', 'nn.functional.linear', 'Tensor.__torch_function__')\n"
        "def now():\n"
        "    out = []\n"
        "    for n in names:\n"
        "        o = torch\n"
        "        for part in n.split('.'):\n"
        "            o = getattr(o, part)\n"
        "        out.append(o)\n"
        "    return out\n"
        "orig = now()\n"
        "import meshshard.shardtensor as st, meshshard.models, meshshard.parallel\n"
        "assert now() == orig, 'patched on import'\n"
        "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:0', rank=0, "
        "world_size=1)\n"
        "mesh = torch.distributed.device_mesh.init_device_mesh('cpu', (1,))\n"
        "x = st.from_local(torch.randn(5, 3, requires_grad=True), mesh, [st.Shard(0)])\n"
        "(torch.nn.functional.linear(x, torch.randn(2, 3, requires_grad=True)) ** 2)"
        ".sum().backward()\n"
        "assert now() == orig, 'patched by using a ShardTensor'\n"
        "dist.destroy_process_group()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
