"""The ShardTensor's layout functions: ``from_local`` with
the library's checks, ``redistribute`` between Shard (uneven, empty shards), Replicate and
Partial with gradients to second order, eager and under ``torch.compile``, and the reference
Transolver on a 2-D ("data", "domain") mesh. Oracle: one process on the full data, fp64."""

import pytest
import torch

from tests.shardtensor import _layout_fns as fns
from tests.shardtensor._oracle import close, ranks_once

# fp64 results that are permutations and sums of the same values: measured worst 1.1e-14
# relative (4 ranks, layout cases and the 2-D mesh Transolver); 1e-10 leaves room for other CPUs
_RTOL = 1e-10
LAYOUTS = {2: [((3, 5), (6, 2)), ((0, 8), (8, 0))], 3: [((7, 0, 13), (1, 10, 9))],
           4: [((1, 1, 6, 0), (0, 4, 0, 4))]}


def _check(rep: dict, where: str) -> None:
    for key, v in rep.items():
        if isinstance(v, str):
            if key in ("declared sizes that disagree", "Partial prod", "bad target sizes",
                       "a ShardTensor given"):
                assert v, f"{where} {key}: no error raised"
                continue
            assert not v, f"{where} {key}: {v}"
            continue
        close(*v, f"{where} {key}", _RTOL)


COMPILE_LAYOUTS = [((3, 5), (5, 3)), ((6, 4), (0, 10)), ((9, 2), (4, 7))]


def _layouts_mesh_and_compile(rank, world, layouts):
    out = {"layouts": {s: fns.layout_cases(rank, world, s, o) for s, o in layouts}}
    if world == 4:  # the other cases share these spawns of ranks
        out["2-d mesh"] = _nd(rank, world)
    if world == 2:
        out["compile"] = fns.compile_redistribute_case(rank, world, COMPILE_LAYOUTS)
    return out


def _results(world):
    return ranks_once(_layouts_mesh_and_compile, world, LAYOUTS[world], timeout=400)


@pytest.mark.parametrize("world", sorted(LAYOUTS))
def test_redistribute_values_and_gradients_equal_one_process(world):
    for rank, res in enumerate(_results(world)):
        for sizes, rep in res["layouts"].items():
            assert len(rep) >= 20
            _check(rep, f"rank {rank} {sizes}")
            # the refusals name the problem
            assert "disagree" in rep["declared sizes that disagree"]
            assert "Partial('prod')" in rep["Partial prod"]
            assert "summing to" in rep["bad target sizes"]
            assert "to_local()" in rep["a ShardTensor given"]


def _nd(rank, world):
    # batch replicated on "data", points uneven on "domain" (a batch sharded on "data" as well
    # needs views that merge two sharded dims: not covered yet)
    return {"(2, 9)": fns.nd_mesh_case(rank, world, None, (2, 9)),
            "(0, 7)": fns.nd_mesh_case(rank, world, None, (0, 7))}


def test_transolver_on_a_2d_mesh_equals_one_process():
    for rank, per in enumerate(r["2-d mesh"] for r in _results(4)):
        for name, rep in per.items():
            _check(rep, f"rank {rank} {name}")


def test_redistribute_compiles_without_graph_breaks_and_equals_eager():
    for rank, rep in enumerate(r["compile"] for r in _results(2)):
        assert 1 <= rep["compiles"] <= len(COMPILE_LAYOUTS), rep["compiles"]
        for k, pair in enumerate(rep["per layout"]):
            for got, want in zip(pair["compiled"], pair["eager"]):
                torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12,
                                           msg=lambda m, k=k, r=rank: f"rank {r} layout {k}: {m}")
