"""torch.compile on ShardTensors: compiled equals eager equals one process (outputs, losses,
input and parameter gradients) on uneven layouts, and blocks that are not local raise.

One process per rank and one compiled model per variant serve every layout (compilation is the
slow part); the backend is aot_eager (dynamo + AOTAutograd, no C++ build)."""

import pytest
import torch

from meshshard.testing import run_ranks
from tests.shardtensor import _compile_fns

LAYOUTS = [(3, 5), (0, 8)]


def _close(a, b, what):
    atol = 1e-5 * float(b.abs().max()) + 1e-7 if b.numel() else 1e-7
    torch.testing.assert_close(a, b, rtol=1e-5, atol=atol, msg=lambda m: f"{what}: {m}")


def _check(reports, variants, min_keys):
    for rank, per_layout in enumerate(reports):
        for sizes, rep in zip(LAYOUTS, per_layout):
            ref = rep["ref"]
            assert len(ref) >= min_keys
            for name in variants:
                got = rep[name]
                assert got.keys() == ref.keys()
                for key, want in ref.items():
                    what = f"rank {rank} layout {sizes} {name} {key}"
                    if isinstance(want, float):
                        assert got[key] == pytest.approx(want, rel=1e-5, abs=1e-7), what
                    else:
                        _close(got[key], want, what)


@pytest.fixture(scope="module")
def mlp_reports():
    # one spawn for the MLP cases and the error cases (process start is a large part of it)
    return run_ranks(_compile_fns.mlp, 2, LAYOUTS, timeout=300)


def test_mlp_compile_local_equals_eager_and_single_process(mlp_reports):
    _check([r[0] for r in mlp_reports], ("eager", "local", "local+torch.compile"), min_keys=10)


def test_transolver_compiled_equals_eager_and_single_process():
    reports = run_ranks(_compile_fns.transolver, 2, LAYOUTS, timeout=300)
    _check([r[0] for r in reports], ("eager", "torch.compile", "local", "local+torch.compile"),
           min_keys=20)
    # the plan's blocks (2 models x 2 blocks) were compiled, plus torch.compile's small graphs
    assert all(r[1] >= 4 for r in reports), [r[1] for r in reports]


def test_blocks_that_are_not_local_raise_on_every_rank(mlp_reports):
    for _, rep in mlp_reports:
        assert rep["attention"].startswith("LocalityError"), rep["attention"]
        assert "communicates (all_reduce)" in rep["attention"]
        # rank 0 holds 3 of 8 rows: x / x.shape[1] differs there; rank 1 learns it from rank 0
        assert rep["global size"].startswith("LocalityError"), rep["global size"]
        assert rep["mixed layouts"].startswith("LayoutError"), rep["mixed layouts"]
        assert "redistribute" in rep["mixed layouts"]
        assert rep["hook calls"] == ["ShardTensor"] * len(LAYOUTS)
        assert rep["graphs"] >= 2  # the two compile_local'd MLPs were compiled


def test_plan_with_unknown_name_raises():
    from meshshard.models import Transolver
    from meshshard.shardtensor.compile import compile_local_plan

    model = Transolver(3, 0, 1, n_hidden=8, n_layers=1, heads=2, slices=2)
    with pytest.raises(ValueError, match="matches no submodule.*blocks.0.mlp"):
        compile_local_plan(model, ["blocks.*.mlpp"])
    with pytest.raises(ValueError, match="lies inside"):
        compile_local_plan(model, ["blocks.0", "blocks.0.mlp"])
