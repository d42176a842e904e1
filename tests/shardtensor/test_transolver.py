"""The unmodified reference Transolver on ShardTensors equals one process: outputs, loss, every
parameter gradient, and weights after optimizer steps (fp32, rtol 1e-5)."""

import pytest
import torch

from meshshard.testing import run_ranks
from tests.shardtensor import _model_fns

RTOL = 1e-5


def _close(a, b, what):
    # elementwise rtol 1e-5, plus an absolute floor at 1e-5 of the tensor's scale for entries
    # that are near zero (summation order differs across ranks)
    atol = 1e-5 * float(b.abs().max()) + 1e-7
    torch.testing.assert_close(a, b, rtol=RTOL, atol=atol, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("sizes", [(3, 5), (0, 8), (1, 1, 6), (2, 0, 5, 1)],
                         ids=lambda s: "x".join(map(str, s)))
def test_transolver_matches_single_process(sizes):
    reports = run_ranks(_model_fns.transolver_1d, len(sizes), sizes, 3, timeout=300)
    for rank, rep in enumerate(reports):
        _close(*rep["out"], f"rank {rank} output")
        _close(*rep["loss"], f"rank {rank} loss")
        assert len(rep["grads"]) > 20
        for name, (g, g_ref) in rep["grads"].items():
            _close(g, g_ref, f"rank {rank} grad {name}")
        for a, b in rep["losses"]:
            assert a == pytest.approx(b, rel=1e-5, abs=1e-7)
        for name, (w, w_ref) in rep["weights"].items():
            _close(w, w_ref, f"rank {rank} weight {name} after Adam steps")


def test_transolver_data_x_domain_mesh():
    reports = run_ranks(_model_fns.transolver_2d, 4, (2, 5), timeout=300)
    for rank, rep in enumerate(reports):
        _close(*rep["out"], f"rank {rank} output")
        _close(*rep["loss"], f"rank {rank} loss")
        for name, (g, g_ref) in rep["grads"].items():
            _close(g, g_ref, f"rank {rank} grad {name}")
