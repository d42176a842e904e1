"""The reference PointTransformer, unmodified, domain-parallel on ShardTensors: outputs, every
parameter gradient and the weights after optimizer steps equal one process (self-attention over
points sharded unevenly, cross-attention from query points in another layout, key padding,
causal)."""

from __future__ import annotations

import pytest
import torch

from meshshard.testing import RankCases
from tests.models._pt_fns import point_transformer_cases

CASES = RankCases(point_transformer_cases, {
    2: [
        {"x": [3, 5], "q": [6, 1], "kpm": True},
        {"x": [0, 8], "causal": True, "dtype": torch.float32},
        {"x": [5, 3], "q": None, "M": 4, "dtype": torch.float32},  # replicated queries
    ],
    4: [
        {"x": [1, 1, 6, 0], "q": [2, 0, 5, 1]},
        {"x": [2, 0, 5, 1], "q": [3, 3, 0, 1], "kpm": True, "dtype": torch.float32},
    ],
}, timeout=240)


@pytest.mark.parametrize(("P", "ci"), CASES.params())
def test_point_transformer_matches_one_process(P, ci):
    for rank, error in enumerate(CASES.per_rank(P, ci)):
        assert error is None, f"case {CASES.case(P, ci)} rank {rank}:\n{error}"


def test_point_transformer_plain_torch():
    from meshshard.models import PointTransformer

    m = PointTransformer(4, 2, dim=16, heads=4, depth=1, query_dim=3)
    assert m(torch.randn(2, 10, 4), torch.randn(2, 7, 3)).shape == (2, 7, 2)
    assert PointTransformer(4, 3, dim=16, heads=2)(torch.randn(1, 9, 4)).shape == (1, 9, 3)
    with pytest.raises(ValueError, match="no decoder"):
        PointTransformer(4, 3, dim=16, heads=2)(torch.randn(1, 9, 4), torch.randn(1, 2, 3))


def test_example_under_torchrun():
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(root / "examples" / "point_transformer.py")],
        capture_output=True, text=True, timeout=300, env=env, cwd=root,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rank 0: 166 of 500 probe outputs" in r.stdout
    assert "rank 1: 334 of 500 probe outputs" in r.stdout
    assert r.stdout.count("gradients equal a single-process run: True") == 2, r.stdout
