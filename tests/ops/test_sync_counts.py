"""Host syncs per call of the neighbour ops on ShardTensors (forward and backward, 2 gloo
ranks, layout (3, 5), a warm call), counted by :mod:`meshshard.testing.sync_census` and
pinned: a change that adds a read-back, a boolean mask or a host-built tensor to these paths
fails here, with the census' per-line report.

The kNN and radius counts are the device path's (``backend="grid"``, the default off the CPU);
the CPU tree path reads its inputs back to numpy by design.
"""

from __future__ import annotations

import pytest

from meshshard.testing.distributed import run_ranks
from tests.ops._sync_fns import op_syncs

# the most a call may cost; a GPU pays each of these as a stall of its stream. kNN: the input
# check, the local search's two passes, the forwarded queries' counts, the answers' one pass;
# radius: the check, the import counts, the search, the compaction, the padded width (capped:
# the first three only); gather / scatter: the one count exchange; a ghost refresh: none
LIMITS = {"knn": 5, "radius": 5, "radius_static": 3, "gather": 1, "scatter": 1, "halo": 0}


@pytest.fixture(scope="module")
def counts():
    return run_ranks(op_syncs, 2, [3, 5], {"backend": "grid"}, timeout=120)


@pytest.mark.parametrize("op", sorted(LIMITS))
def test_host_syncs_per_call(counts, op: str) -> None:
    for rank, res in enumerate(counts):
        total, report = res[op]
        assert total <= LIMITS[op], f"{op} on rank {rank}:\n{report}"
