"""``F.scaled_dot_product_attention`` on the aten-level ShardTensor (issue 22, porting step 3):
ring attention over uneven token shards (empty shards, cross-attention lengths), causal and
masked, keys whole or query whole; masks (bool and additive, key-padding and full) sharded like
the query rows or on their key dim (with the keys' sizes or others); and the reference point
transformer eager and under plain ``torch.compile``. Oracle: torch's attention on the full
tensors in one process, fp64, output and the gradients of q, k, v."""

import pytest
import torch

from meshshard.testing import run_ranks
from tests.shardtensor import _aten_attention_fns as fns

# fp64: the log-sum-exp merge reorders sums; measured worst 1.8e-15 relative (2 ranks, every
# case and the point transformer), 2.3e-15 with the masks sharded on their key dim (dq of an
# additive mask, 2 and 4 ranks; max |got - want| / max |want|); 1e-10 leaves room for other
# CPUs' summation orders
_RTOL = 1e-10
LAYOUTS = {2: [((3, 5), (3, 5)), ((0, 8), (6, 1))], 3: [((7, 0, 13), (2, 9, 0))],
           4: [((1, 1, 6, 0), (0, 4, 0, 4))]}


def _close(got, want, what):
    atol = _RTOL * float(want.abs().max()) if want.numel() else 0.0
    torch.testing.assert_close(got, want, rtol=_RTOL, atol=atol, msg=lambda m: f"{what}: {m}")


_RESULTS: dict = {}


def _all(rank, world, layouts):
    out = {"sdpa": {s: fns.sdpa_cases(rank, world, s, k) for s, k in layouts}}
    if world == 2:  # the model cases share this spawn of ranks
        out["transformer"] = {s: fns.transformer_case(rank, world, s, compile_too=(s == (5, 7)))
                              for s in ((5, 7), (0, 9))}
        out["padding"] = {s: fns.transformer_padding_case(rank, world, s)
                          for s in ((5, 7), (9, 0))}
    return out


def _results(world):
    if world not in _RESULTS:
        _RESULTS[world] = run_ranks(_all, world, LAYOUTS[world], timeout=500)
    return _RESULTS[world]


@pytest.mark.parametrize("world", sorted(LAYOUTS))
def test_attention_equals_one_process(world):
    for rank, res in enumerate(_results(world)):
        for sizes, rep in res["sdpa"].items():
            assert len(rep) >= 63  # 15 cases x (out, dq, dk, dv), 2 3-d outputs, dropout
            assert "dropout_p=0.1" in rep.pop("dropout refused")
            for key, (got, want) in rep.items():
                _close(got, want, f"rank {rank} {sizes} {key}")


def test_point_transformer_eager_and_compiled_equals_one_process():
    for rank, res in enumerate(_results(2)):
        for sizes, rep in res["transformer"].items():
            if "graph breaks" in rep:
                assert rep.pop("graph breaks") == 0
                assert rep.pop("compiles") >= 1
            for key, (got, want) in rep.items():
                _close(got, want, f"rank {rank} {sizes} {key}")


def test_point_transformer_key_padding_sum_loss_eager_and_compiled_equals_one_process():
    for rank, res in enumerate(_results(2)):
        for sizes, rep in res["padding"].items():
            assert rep.pop("graph breaks") == 0
            assert rep.pop("compiles") >= 1
            assert len(rep) >= 2 * (2 + 1)  # eager and compiled: out, input grad, weights
            for key, (got, want) in rep.items():
                _close(got, want, f"rank {rank} {sizes} {key}")
