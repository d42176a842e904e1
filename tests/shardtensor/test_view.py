"""The view rules against one process: views splitting a sharded dim (the rows that change owner
move, by one all-to-all) and splitting it by whole rows on one or two mesh dims; a view merging
dims sharded on two mesh dims fails with a clear error; a dim of global size 1 sharded over a mesh
dim of size 1 (a batch of one on a data axis of one, as on a 1 x domain x tensor mesh) survives
reshapes that keep it.

On 2, 3 and 4 gloo ranks, layouts with an empty and a one-row shard and a 2x2 mesh (one spawn per
world size runs every family's cases: :mod:`tests.shardtensor._rule_cases`): every output, and
the gradients of a random projection of them w.r.t. the sharded leaf and the plain weights
(``torch.autograd.grad``), equal one process in fp64."""

import pytest
import torch

from meshshard.testing import run_ranks
from tests.shardtensor import _rule_cases as cases
from tests.shardtensor._view_fns import reshape_batch_of_one


@pytest.mark.parametrize("world", sorted(cases.LAYOUTS))
def test_views_forward_and_gradients_equal_one_process(world):
    cases.check_cases("view", world)


@pytest.mark.parametrize("world", sorted(cases.LAYOUTS))
def test_a_view_merging_two_sharded_dims_fails_with_a_clear_error(world):
    cases.check_probes("view", world)


def test_reshape_keeps_a_size_one_sharded_dim():
    for rep in run_ranks(reshape_batch_of_one, 2, timeout=60):
        assert rep["placements"] == ("S(0)", "S(1)")
        assert rep["sizes"] == ((1,), (3, 5))
        torch.testing.assert_close(*rep["y"])
        torch.testing.assert_close(*rep["back"])
        torch.testing.assert_close(rep["grad"], torch.full_like(rep["grad"], 2.0))
