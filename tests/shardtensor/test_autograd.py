"""Autograd on the wrapper: torch's training features on ShardTensors, and torch left unpatched.

Oracle: the reference Transolver on all points in one process. On 2, 3 and 4 gloo ranks with
uneven layouts and an empty shard: ``autograd.grad`` w.r.t. sharded inputs (first and second
order), reentrant and non-reentrant checkpointing, ``register_hook``, a custom
``autograd.Function`` (no patch of ``Function.apply``), ``torch.func.grad`` and bf16 autocast.
Importing or using the class patches nothing in torch, and the private torch names it uses still
exist. (``torch.compile`` of the same model: ``test_compile.py``.)
"""

import subprocess
import sys

import pytest

from meshshard.testing import run_ranks
from tests.shardtensor import _training_fns
from tests.shardtensor._oracle import close

# fp64 cases: measured differences from one process are <= 3e-14 relative;
# 1e-10 leaves four orders of magnitude for other CPUs' summation orders
_RTOL64 = 1e-10
LAYOUTS = {2: [(3, 5), (0, 8)], 3: [(7, 0, 13)], 4: [(1, 1, 6, 0)]}


def _all_cases(rank, world, layouts):
    return {sizes: _training_fns.cases(rank, world, sizes) for sizes in layouts}


@pytest.mark.parametrize("world", sorted(LAYOUTS))
def test_training_features_equal_one_process(world):
    reports = run_ranks(_all_cases, world, LAYOUTS[world], timeout=300)
    for rank, per_layout in enumerate(reports):
        for sizes, rep in per_layout.items():
            assert len(rep) > 20
            for key, (got, want) in rep.items():
                close(got, want, f"rank {rank} {sizes} {key}", _RTOL64)


def test_bf16_autocast_equals_one_process_within_the_bf16_floor():
    for rank, rep in enumerate(run_ranks(_training_fns.autocast_case, 2, (3, 5), timeout=300)):
        assert rep["sharded"]["out dtype"] == rep["bf16"]["out dtype"] == "torch.bfloat16"
        for key, want in rep["bf16"].items():
            if key == "out dtype":
                continue
            got, exact = rep["sharded"][key], rep["fp32"][key]
            # the floor: how far one process in bf16 is from fp32; the sharded run differs
            # from one process in bf16 by its own summation order, within a few floors
            floor = float((want - exact).abs().max())
            assert floor > 0, key  # autocast really ran in bf16
            err = float((got - want).abs().max())
            assert err <= 4 * floor + 1e-6, (rank, key, err, floor)


# what a user does with the class, in a fresh interpreter with a 1-rank gloo group: (imports,
# then the use)
_USES = {
    "from_local_linear": (
        "import meshshard.shardtensor as st, meshshard.models, meshshard.parallel\n",
        "x = st.from_local(torch.randn(5, 3, requires_grad=True), mesh, [st.Shard(0)])\n"
        "(torch.nn.functional.linear(x, torch.randn(2, 3, requires_grad=True)) ** 2)"
        ".sum().backward()\n"),
    "wrap_local": (
        "from torch.distributed.tensor import Shard\n"
        "from meshshard.shardtensor._aten import wrap_local\n",
        "x = wrap_local(torch.randn(4, 3, requires_grad=True), mesh, [Shard(0)], [(4,)])\n"
        "(x * x).sum().backward()\n"),
}


@pytest.mark.parametrize("use", list(_USES))
def test_importing_or_using_shardtensor_changes_nothing_in_torch(use):
    # STYLE: nothing configures the process on import, and nothing is patched on use either
    # (autograd lives on the wrapper, Function.apply is torch's own)
    imports, body = _USES[use]
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
        f"{imports}"
        "assert now() == orig, 'patched on import'\n"
        "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:0', rank=0, "
        "world_size=1)\n"
        "mesh = torch.distributed.device_mesh.init_device_mesh('cpu', (1,))\n"
        f"{body}"
        "assert now() == orig, 'patched by using a ShardTensor'\n"
        "dist.destroy_process_group()\n"
        "print('unchanged')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "unchanged" in res.stdout


def test_the_private_torch_names_it_uses_still_exist():
    # one adapter module holds them; a torch upgrade that moves one fails here, by name
    import importlib

    from meshshard.shardtensor._aten import _torch_private

    for name in _torch_private.NAMES:
        mod, _, attr = name.rpartition(".")
        found = getattr(importlib.import_module(mod), attr, None)
        # functions, or the one dict of FX node metadata (``current_meta``)
        assert callable(found) or isinstance(found, dict), name
