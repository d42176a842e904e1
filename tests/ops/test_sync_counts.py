"""Host syncs per call of the neighbour ops on ShardTensors (forward and backward, 2 gloo
ranks, a warm call), counted by :mod:`meshshard.testing.sync_census` and pinned: a change that
adds a read-back, a boolean mask or a host-built tensor to these paths fails here, with the
census' per-line report."""

from __future__ import annotations

import pytest

from meshshard.testing.distributed import run_ranks
from tests.ops._sync_fns import op_syncs

# the most a call may cost; a GPU pays each of these as a stall of its stream
LIMITS = {"gather": 1, "scatter": 1}


@pytest.fixture(scope="module")
def counts():
    return run_ranks(op_syncs, 2, [3, 5], {"ops": sorted(LIMITS)}, timeout=120)


@pytest.mark.parametrize("op", sorted(LIMITS))
def test_host_syncs_per_call(counts, op: str) -> None:
    for rank, res in enumerate(counts):
        total, report = res[op]
        assert total <= LIMITS[op], f"{op} on rank {rank}:\n{report}"
