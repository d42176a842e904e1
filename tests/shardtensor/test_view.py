"""The view rules against one process: views splitting a sharded dim (the rows that change owner
move, by one all-to-all) and splitting it by whole rows on one or two mesh dims; a view merging
dims sharded on two mesh dims fails with a clear error; a dim of global size 1 sharded over a mesh
dim of size 1 (a batch of one on a data axis of one, as on a 1 x domain x tensor mesh) survives
reshapes that keep it.

Cases: ``_view_fns.py``, run and compared with one process by
:mod:`tests.shardtensor._rule_cases`."""

import torch

from meshshard.testing import run_ranks
from tests.shardtensor import _rule_cases as cases
from tests.shardtensor._view_fns import reshape_batch_of_one


def test_views_forward_and_gradients_equal_one_process(rule_world):
    cases.check_cases("view", rule_world)


def test_a_view_merging_two_sharded_dims_fails_with_a_clear_error(rule_world):
    cases.check_probes("view", rule_world)


def test_reshape_keeps_a_size_one_sharded_dim():
    for rep in run_ranks(reshape_batch_of_one, 2, timeout=60):
        assert rep["placements"] == ("S(0)", "S(1)")
        assert rep["sizes"] == ((1,), (3, 5))
        torch.testing.assert_close(*rep["y"])
        torch.testing.assert_close(*rep["back"])
        torch.testing.assert_close(rep["grad"], torch.full_like(rep["grad"], 2.0))
