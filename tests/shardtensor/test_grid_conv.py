"""Grids on ShardTensors: the grid rules (convolution, pooling, padding, resampling, norms).

Oracle: one process on the whole grid, fp64. On 2, 3 and 4 gloo ranks, grids sharded along one
spatial dim with uneven slabs (an empty slab, one-row slabs), and on a 2x2 mesh along two
spatial dims (and batch x spatial): per-op cases (conv with odd kernels, stride, dilation,
groups, 'same'; transposed conv; max/avg/adaptive pooling with indices; constant/reflect/
replicate/circular padding; nearest/bilinear interpolation; group/instance/batch norm with running
statistics) and the reference UNet3d (loss, output, every parameter gradient, and the input
gradient by ``torch.autograd.grad`` w.r.t. the sharded input; every norm and padding mode);
layouts the rules cannot do fail with a clear error. Then plain
``torch.compile(unet)`` on the sharded input: 0 graph breaks, equal to eager, one compilation
per slab layout (halo plans specialise on the layout) and none for a layout seen before.
"""

import pytest

from meshshard.testing import run_ranks
from tests.shardtensor import _grid_conv_fns
from tests.shardtensor._oracle import close

# fp64: measured differences from one process are <= 2.3e-15 relative (UNet) and rounding
# level per op; 1e-10 leaves room for other CPUs' summation orders
_RTOL = 1e-10

JOBS = {
    2: [("ops", (2,), [2], [(3, 5)]), ("ops", (2,), [2], [(0, 8)]),
        ("unet", (2,), [2], [(3, 5)], "group"), ("unet", (2,), [2], [(0, 8)], "batch"),
        ("unet", (2,), [2], [(1, 7)], "instance"),
        ("unet", (2,), [2], [(1, 7)], "group", "circular"), ("errors",)],
    3: [("ops", (3,), [2], [(1, 0, 7)]), ("unet", (3,), [2], [(1, 0, 7)], "group"),
        ("unet", (3,), [2], [(2, 5, 1)], "batch")],
    4: [("ops", (4,), [2], [(2, 0, 5, 1)]), ("ops", (2, 2), [2, 3], [(3, 5), (1, 5)]),
        ("unet", (4,), [2], [(2, 0, 5, 1)], "batch"), ("unet", (4,), [2], [(1, 1, 6, 0)], "group"),
        ("unet", (4,), [2], [(2, 0, 5, 1)], "instance", "reflect"),
        ("unet", (4,), [2], [(1, 1, 6, 0)], "batch", "circular"),
        ("unet", (4,), [2], [(1, 1, 6, 0)], "group", "replicate"),
        ("unet", (2, 2), [2, 3], [(3, 5), (1, 7)], "group"),
        ("unet", (2, 2), [2, 4], [(0, 8), (5, 3)], "batch"),
        ("unet", (2, 2), [0, 2], [(1, 1), (3, 5)], "group")],
}


@pytest.fixture(scope="module", params=sorted(JOBS))
def reports(request):
    world = request.param
    return world, run_ranks(_grid_conv_fns.all_cases, world, JOBS[world], timeout=600)


def test_grid_ops_and_unet_equal_one_process(reports):
    world, reps = reports
    for rank, per_job in enumerate(reps):
        for job, rep in zip(JOBS[world], per_job):
            if job[0] == "errors":  # layouts the rules cannot do: a clear error naming the op
                assert "channel dim 1" in rep["channel-sharded conv"]
                assert "does not divide the sharded dim" in rep["adaptive pool not dividing"]
                assert "no sharding rule for aten.cummax" in rep["an op with no rule"]
                continue
            # conv biases in front of a norm have a zero true gradient: both sides are
            # rounding noise, judged against the largest gradient of the case
            scale = max((float(b.abs().max()) for k, (_, b) in rep.items()
                         if k.startswith("grad ")), default=0.0)
            assert len(rep) > (40 if job[0] == "unet" else 70), (job, len(rep))
            for key, (got, want) in rep.items():
                close(got, want, f"rank {rank} {job} {key}", _RTOL,
                      scale if key.startswith("grad ") else 0.0)


def test_plain_torch_compile_of_the_unet():
    layouts = [(3, 5), (0, 8), (3, 5)]
    reports = run_ranks(_grid_conv_fns.compile_case, 2, layouts, timeout=600)
    for rank, rep in enumerate(reports):
        assert rep["graph breaks"] == 0, rep["break reasons"]
        # one compilation per new slab layout, the repeated one reuses its graph
        assert rep["compiles"] == 2, rep["compiles"]
        for sizes, pair in zip(layouts, rep["per layout"]):
            for k, (got, want) in enumerate(zip(pair["compiled"], pair["eager"])):
                close(got, want, f"rank {rank} {sizes} output {k}", _RTOL)
