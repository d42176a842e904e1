"""Tensor parallelism (Megatron column/row linears over "tensor") composed with points sharded
unevenly over "domain": the unmodified reference Transolver under meshshard's plan equals one
process (outputs, loss, every parameter gradient, weights after Adam steps; fp32, rtol 1e-5),
and bad plans fail on every rank before any collective."""

import pytest

from meshshard.testing import run_ranks
from tests.parallel import _tp_fns
from tests.shardtensor._model_fns import assert_trains_like_one_process
from tests.shardtensor._oracle import close

RTOL = 1e-5


def _close(a, b, what):
    # rtol 1e-5 plus an absolute floor at 1e-5 of the tensor's scale (summation order differs)
    close(a, b, what, RTOL, floor=1e-7)


CASES = [
    ((1, 2, 2), (3, 5), False),
    ((1, 2, 2), (0, 8), True),  # inputs on mesh["domain"], as examples/train_drivaerml.py
    ((2, 1, 2), (7,), False),
]


@pytest.mark.parametrize(("shape", "sizes", "submesh", "compiled"),
                         [*(c + (False,) for c in CASES), ((1, 2, 2), (3, 5), False, True)],
                         ids=["1x2x2-3,5", "1x2x2-0,8-domain-inputs", "2x1x2-7",
                              "1x2x2-3,5-torch.compile"])
def test_transolver_tp_matches_single_process(shape, sizes, submesh, compiled):
    reports = run_ranks(_tp_fns.transolver_tp, 4, shape, sizes, 3, submesh, compiled,
                        timeout=300)
    for rank, rep in enumerate(reports):
        # the plan really split the weights: every planned weight, and the biases of the
        # column-parallel linears (row-parallel biases stay replicated): preprocess 2 + 1,
        # per block in_project_x 2 + in_project_fx 2 + to_out 1 + mlp.pre 2 + mlp.post 1
        assert rep["n_dtensor"] == 3 + 2 * 8
        assert rep["local_w"] == (rep["full_w"][0] // 2, rep["full_w"][1])
        # column-parallel: features sharded on "tensor" while points stay sharded on "domain";
        # row-parallel: reduced over "tensor" (Replicate) before its bias
        d = ("S(0)" if not submesh else "R", "S(1)")
        for name, feats in (("blocks.0.mlp.pre", 32), ("blocks.0.attn.in_project_x", 16)):
            placements, lsizes = rep["layouts"][name]
            assert placements == (*d, "S(2)"), (name, placements)
            assert lsizes[1] == sizes and lsizes[2] == (feats // 2, feats // 2)
        assert rep["layouts"]["blocks.0.mlp.post"][0] == (*d, "R")
        want = ("domain",) if submesh else ("data", "domain", "tensor")
        assert rep["out_mesh"] == want
        assert len(rep["losses"]) == 3 and rep["weights"]
        assert_trains_like_one_process(rep, rank)


@pytest.mark.parametrize(("case", "needle"), [
    ("missing", "'blocks.*.attn.to_qkv' names no module of Transolver"),
    ("heads", "out_features=18 in units of 6 (3 units) cannot be split evenly over tensor=2"),
    ("features", "'0' -> '0' (Colwise): out_features=5 cannot be split evenly over tensor=2"),
    ("not_linear", "'blocks.0.ln1' is a LayerNorm"),
    ("torch_style", "is not a meshshard ColwiseParallel or RowwiseParallel"),
    ("no_tensor_dim", "has dim names ('data', 'domain'), no 'tensor'"),
    ("foreign_mesh", "its mesh dim 0 ('domain') is not a dim of that mesh with the same ranks"),
], ids=lambda v: v if " " not in v else "")
def test_bad_plan_fails_on_every_rank(case, needle):
    reports = run_ranks(_tp_fns.bad_plan, 4, case, timeout=120)
    for rank, rep in enumerate(reports):
        assert rep["msg"] is not None, f"rank {rank} did not raise"
        kind = "LayoutError" if case == "foreign_mesh" else "TensorParallelPlanError"
        assert rep["msg"].startswith(kind), rep["msg"]
        assert needle in rep["msg"], rep["msg"]
        assert rep["alive"] == 4
        assert rep["unchanged"]


def test_row_parallel_reduced_once():
    """Forward: one all-reduce over "tensor" per row-parallel linear (preprocess.post and, per
    block, attn.to_out and mlp.post); none for column-parallel linears or per-head ops."""
    reports = run_ranks(_tp_fns.count_tensor_allreduces, 4, (3, 5), timeout=120)
    for rep in reports:
        assert rep["tensor"] == 1 + 2 * 2, rep
        assert rep["other"] == 0, rep


def test_tp_with_torch_ddp_over_data():
    """TP composes with torch's DDP over "data" (via torch's own DDP+TP transform): every
    gradient of the first step equals one process on both samples; per-data-rank losses of 2
    Adam steps average to the single-process loss."""
    reports = run_ranks(_tp_fns.transolver_tp_ddp, 4, 2, timeout=300)
    for rank, rep in enumerate(reports):
        assert rep["split"] == 19
        assert len(rep["grads"]) > 20
        for name, (g, g_ref) in rep["grads"].items():
            _close(g, g_ref, f"rank {rank} grad {name}")
    for step in range(2):
        mean = (reports[0]["losses"][step][0] + reports[2]["losses"][step][0]) / 2
        assert mean == pytest.approx(reports[0]["losses"][step][1], rel=1e-5)


def test_tp_alone_on_plain_tensors():
    for rank, rep in enumerate(run_ranks(_tp_fns.transolver_tp_plain, 4, timeout=120)):
        assert rep["type"] == "Tensor"
        assert rep["local_w"] == (4, 16)  # one head of 4 features per rank
        _close(*rep["out"], f"rank {rank} output")
        for name, (g, g_ref) in rep["grads"].items():
            _close(g, g_ref, f"rank {rank} grad {name}")
