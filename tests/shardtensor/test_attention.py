"""Ring attention (``F.scaled_dot_product_attention`` on token-sharded ShardTensors) against one
process: outputs and gradients of q, k, v on uneven layouts (empty shards included), cross-
attention with different query and key layouts, masks, causal, grouped heads; and bad input
refused on every rank without a hang. One spawn of ranks per world size runs every case.

In fp64 as well: ring attention over uneven token shards (empty shards, cross-attention lengths),
causal and masked, keys whole or query whole; masks (bool and additive, key-padding and full)
sharded like the query rows or on their key dim (with the keys' sizes or others); and the
reference point transformer eager and under plain ``torch.compile``. Oracle: torch's attention
on the full tensors in one process, output and the gradients of q, k, v."""

from __future__ import annotations

import pytest
import torch

from meshshard.testing import run_ranks
from tests.shardtensor import _attention_fns as fns
from tests.shardtensor._attention_fns import attention_cases
from tests.shardtensor._oracle import close, ranks_once

F32 = torch.float32

CASES = {
    2: [
        {"q": [3, 5], "kv": [3, 5]},
        {"q": [0, 8], "kv": [0, 8]},
        {"q": [3, 5], "kv": [0, 8], "causal": True},
        {"q": [3, 5], "kv": [3, 5], "causal": True},
        {"q": [5, 3], "kv": [6, 1], "Ev": 5},  # cross-attention, Lq != Lk, Ev != E
        {"q": [3, 5], "kv": [4, 6], "causal": True, "layout": "bnhe"},
        {"q": [3, 5], "kv": [3, 5], "mask": "bool_rows"},
        {"q": [3, 5], "kv": [7, 2], "mask": "add_rep", "scale": 0.3},
        {"q": [3, 5], "kv": [2, 7], "mask": "kpm"},
        {"q": [3, 5], "kv": [2, 7], "mask": "kpm_rep", "layout": "3d"},
        {"q": [3, 5], "kv": [3, 5], "mask": "dead_rows"},
        {"q": [3, 5], "kv": [5, 3], "H": 4, "Hk": 2},  # grouped K/V heads
        {"q": [3, 5], "kv": None, "Lk": 6, "causal": True},  # K/V replicated: no ring
        {"q": [3, 5], "kv": None, "Lk": 9, "mask": "bool_rows"},
        {"q": None, "Lq": 4, "kv": [3, 5]},  # Q replicated: merge by log-sum-exp
        {"q": None, "Lq": 5, "kv": [0, 8], "mask": "kpm", "Ev": 3},
        {"q": None, "Lq": 6, "kv": [2, 4], "mask": "bool_rep"},
        {"q": [3, 5], "kv": [3, 5], "dtype": F32, "causal": True},
        {"q": [0, 8], "kv": [6, 2], "dtype": F32, "mask": "bool_rows", "layout": "bnhe"},
        {"q": [3, 5], "kv": [3, 5], "dtype": F32, "Ev": 4, "mask": "add_rep"},  # math path
        # key chunks of at most 2 rows per rank: several ring passes per head
        {"q": [3, 5], "kv": [5, 4], "chunk": 2, "causal": True},
        {"q": [0, 8], "kv": [7, 0], "chunk": 2, "mask": "bool_rows", "H": 4, "Hk": 2},
        {"q": None, "Lq": 4, "kv": [3, 6], "chunk": 2, "mask": "kpm"},
        {"q": [3, 5], "kv": None, "Lk": 7, "chunk": 3, "mask": "add_rep"},
        {"q": [4, 4], "kv": [2, 6], "chunk": 2, "mask": "bool_heads", "H": 4, "Hk": 2},
        # query tiles of 2 rows: a block's output, dq and dk/dv shares are summed over tiles
        {"q": [3, 5], "kv": [4, 5], "qtile": 2, "chunk": 3, "causal": True},
        {"q": [3, 5], "kv": [3, 5], "qtile": 2, "mask": "dead_rows"},
        {"q": [0, 8], "kv": [6, 2], "qtile": 3, "mask": "bool_rows", "H": 4, "Hk": 2},
        {"q": [3, 5], "kv": [3, 5], "qtile": 2, "dtype": F32, "Ev": 4, "mask": "add_rep"},
        {"q": None, "Lq": 5, "kv": [3, 6], "qtile": 2, "mask": "kpm"},
        {"q": [3, 5], "kv": None, "Lk": 7, "qtile": 2, "causal": True},
    ],
    3: [
        {"q": [1, 1, 6], "kv": [1, 1, 6], "causal": True},
        {"q": [1, 1, 6], "kv": [4, 0, 3], "mask": "bool_rows"},
        {"q": [1, 1, 6], "kv": [2, 2, 2], "H": 4, "Hk": 1, "causal": True, "dtype": F32},
    ],
    4: [
        {"q": [2, 0, 5, 1], "kv": [2, 0, 5, 1], "causal": True},
        {"q": [1, 1, 6, 0], "kv": [0, 3, 0, 5], "mask": "kpm", "layout": "bnhe"},
        {"q": [3, 5, 0, 2], "kv": [1, 1, 1, 9], "Ev": 6, "causal": True},
        {"q": None, "Lq": 3, "kv": [2, 0, 5, 1], "causal": True},
        {"q": [2, 2, 2, 2], "kv": None, "Lk": 5, "mask": "add_rep"},
        {"q": [1, 1, 6, 0], "kv": [3, 3, 1, 1], "dtype": F32, "mask": "bool_rows"},
        {"q": [2, 0, 5, 1], "kv": [1, 5, 0, 3], "chunk": 2, "causal": True, "layout": "bnhe"},
        {"q": [1, 1, 6, 0], "kv": [2, 0, 5, 1], "chunk": 2, "qtile": 2, "causal": True},
        {"q": [3, 5, 0, 2], "kv": [2, 0, 5, 1], "qtile": 2, "mask": "bool_rows", "H": 4,
         "Hk": 2},
    ],
}

BAD = {
    "kv_layouts": ("LayoutError", "key and value are laid out differently"),
    "v_replicated": ("LayoutError", "key and value are laid out differently"),
    "head_dims": ("ValueError", "head dims disagree"),
    "mask_shape": ("ValueError", "fails on the global shapes"),
    "mask_layout": ("LayoutError", "attn_mask layout"),
    "mask_partial": ("LayoutError", "a Partial attn_mask is not supported"),
    "mask_grad": ("NotImplementedError", "gradients with respect to attn_mask"),
    "dropout": ("NotImplementedError", "dropout_p=0.1"),
    "mha_need_weights": ("NotImplementedError", "need_weights=False"),
}

def _results(P: int):
    return ranks_once(attention_cases, P, CASES[P], list(BAD), timeout=240)


@pytest.mark.parametrize(("P", "ci"), [(P, i) for P, cs in CASES.items() for i in range(len(cs))])
def test_attention_matches_one_process(P: int, ci: int) -> None:
    for rank, (res, _, _, _) in enumerate(_results(P)):
        assert res[ci] is None, f"case {CASES[P][ci]} rank {rank}:\n{res[ci]}"


@pytest.mark.parametrize("P", [2, 4])
@pytest.mark.parametrize("bi", range(len(BAD)))
def test_bad_input_raises_on_every_rank(P: int, bi: int) -> None:
    name = list(BAD)[bi]
    kind, text = BAD[name]
    for rank, (_, bad, ok, _) in enumerate(_results(P)):
        got_kind, got_msg = bad[bi]
        assert got_kind == kind and text in got_msg, f"{name} rank {rank}: {got_kind} {got_msg}"
        assert ok == P  # the group still works afterwards: nobody hung


@pytest.mark.parametrize("P", sorted(CASES))
def test_ring_shifts_are_batched_p2p(P: int) -> None:
    """NCCL needs a shift's send and receive posted together (at P=2 the ring's predecessor and
    successor are one peer) and matches by post order: no isend/irecv outside a batch."""
    for rank, (*_, (grouped, ungrouped, batches)) in enumerate(_results(P)):
        assert ungrouped == 0, f"rank {rank}: {ungrouped} ungrouped isend/irecv"
        assert grouped > 0 and batches > 0, f"rank {rank}: no ring shift ran ({grouped})"


def test_attention_on_2d_mesh():
    from tests.shardtensor._attention_fns import attention_2d

    for rank, err in enumerate(run_ranks(attention_2d, 4, [0, 7], [5, 2], timeout=240)):
        assert err is None, f"rank {rank}:\n{err}"


def test_mha_on_replicated_inputs_takes_any_option():
    from tests.shardtensor._attention_fns import mha_replicated

    for rank, err in enumerate(run_ranks(mha_replicated, 2, timeout=240)):
        assert err is None, f"rank {rank}:\n{err}"


# fp64: the log-sum-exp merge reorders sums; measured worst 1.8e-15 relative (2 ranks, every
# case and the point transformer), 2.3e-15 with the masks sharded on their key dim (dq of an
# additive mask, 2 and 4 ranks; max |got - want| / max |want|); 1e-10 leaves room for other
# CPUs' summation orders
_RTOL = 1e-10
SDPA_LAYOUTS = {2: [((3, 5), (3, 5)), ((0, 8), (6, 1))], 3: [((7, 0, 13), (2, 9, 0))],
                4: [((1, 1, 6, 0), (0, 4, 0, 4))]}


def _sdpa_and_models(rank, world, layouts):
    out = {"sdpa": {s: fns.sdpa_cases(rank, world, s, k) for s, k in layouts}}
    if world == 2:  # the model cases share this spawn of ranks
        out["transformer"] = {s: fns.transformer_case(rank, world, s, compile_too=(s == (5, 7)))
                              for s in ((5, 7), (0, 9))}
        out["padding"] = {s: fns.transformer_padding_case(rank, world, s)
                          for s in ((5, 7), (9, 0))}
    return out


def _fp64_results(world):
    return ranks_once(_sdpa_and_models, world, SDPA_LAYOUTS[world], timeout=500)


@pytest.mark.parametrize("world", sorted(SDPA_LAYOUTS))
def test_attention_equals_one_process(world):
    for rank, res in enumerate(_fp64_results(world)):
        for sizes, rep in res["sdpa"].items():
            assert len(rep) >= 63  # 15 cases x (out, dq, dk, dv), 2 3-d outputs, dropout
            assert "dropout_p=0.1" in rep.pop("dropout refused")
            for key, (got, want) in rep.items():
                close(got, want, f"rank {rank} {sizes} {key}", _RTOL)


def test_point_transformer_eager_and_compiled_equals_one_process():
    for rank, res in enumerate(_fp64_results(2)):
        for sizes, rep in res["transformer"].items():
            if "graph breaks" in rep:
                assert rep.pop("graph breaks") == 0
                assert rep.pop("compiles") >= 1
            for key, (got, want) in rep.items():
                close(got, want, f"rank {rank} {sizes} {key}", _RTOL)


def test_point_transformer_key_padding_sum_loss_eager_and_compiled_equals_one_process():
    for rank, res in enumerate(_fp64_results(2)):
        for sizes, rep in res["padding"].items():
            assert rep.pop("graph breaks") == 0
            assert rep.pop("compiles") >= 1
            assert len(rep) >= 2 * (2 + 1)  # eager and compiled: out, input grad, weights
            for key, (got, want) in rep.items():
                close(got, want, f"rank {rank} {sizes} {key}", _RTOL)
