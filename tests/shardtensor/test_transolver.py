"""The unmodified reference Transolver on ShardTensors equals one process: outputs, loss, every
parameter gradient, and weights after optimizer steps (fp32, rtol 1e-5)."""

import pytest

from meshshard.testing import run_ranks
from tests.shardtensor import _model_fns


@pytest.mark.parametrize("sizes", [(3, 5), (0, 8), (1, 1, 6), (2, 0, 5, 1)],
                         ids=lambda s: "x".join(map(str, s)))
def test_transolver_matches_single_process(sizes):
    reports = run_ranks(_model_fns.transolver_1d, len(sizes), sizes, 3, timeout=300)
    for rank, rep in enumerate(reports):
        assert len(rep["losses"]) == 3 and rep["weights"]
        _model_fns.assert_trains_like_one_process(rep, rank)


def test_transolver_data_x_domain_mesh():
    reports = run_ranks(_model_fns.transolver_2d, 4, (2, 5), timeout=300)
    for rank, rep in enumerate(reports):
        _model_fns.assert_trains_like_one_process(rep, rank)
