"""One rank misuses ``from_local`` (malformed sizes, other placements, another dtype, ndim,
trailing dim or device type, not a tensor): every rank raises the same one-line error naming
the rank at fault, at once, under a collective timeout of 300 s (a hang would show as a wait
of 300 s; the bound below is far from that and far above a loaded machine's noise)."""

import pytest

from meshshard.testing import run_ranks
from tests.shardtensor import _misuse_fns as F

LONG = 300  # seconds a collective would wait for a rank that never joins

# what the error must name besides the faulty rank: what that rank passed
NAMED = {
    "sizes of the wrong length": "[3, 5",
    "a negative size": "-1 is neither a size",
    "a string": "'3,5'",
    "a 17-dim piece shape": "a local shape of 17 dims",
    "Replicate where the others Shard(0)": "passed [Replicate()] where",
    "Shard(1) where the others Shard(0)": "passed [Shard(dim=1)] where",
    "Partial('max') where the others Shard(0)": "passed [Partial(max)] where",
    "float64 among float32": "passed a piece of dtype float64 where",
    "int64 among float32": "passed a piece of dtype int64 where",
    "a 3-d piece among 2-d": "passed a 3-d piece",
    "trailing dim 5 among 4": "only in the sharded dim",
    "a meta piece among cpu": "passed a piece on meta where",
    "not a tensor": "got a list",
    "a piece of 17 dims": "a piece of 17 dims",
}


@pytest.mark.parametrize("ws", [2, 3])
def test_one_rank_misusing_from_local_fails_every_rank_at_once_with_one_error(ws):
    reps = run_ranks(F.misuse, ws, timeout=LONG, collective_timeout=LONG)
    for name, what in NAMED.items():
        got = [rep[name] for rep in reps]
        assert all(g is not None for g in got), (name, got)  # every rank raised
        assert len({(kind, msg) for kind, msg, _ in got}) == 1, (name, got)  # the same error
        kind, msg, _ = got[0]
        assert kind == ("TypeError" if name == "not a tensor" else "LayoutError"), (name, kind)
        assert msg.startswith("from_local: ") and "\n" not in msg, msg
        assert f"rank {ws - 1} " in msg or f"rank {ws - 1}:" in msg, msg  # the rank at fault
        assert what in msg, (name, msg)
        assert max(s for _, _, s in got) < LONG / 5, (name, got)  # no rank waited it out
    sizes = (3, 5, 2)[:ws]
    # the ranks are still in step: a right call afterwards works on every rank
    total = 2.0 * sum(r * s for r, s in enumerate(sizes))  # pieces (s, 2) filled with the rank
    assert [rep["after"] for rep in reps] == [(sizes, total)] * ws
    for rep in reps:  # one all-gather where validated or inferred (whatever the placements)
        assert rep["collectives"] == {
            "Shard, sizes given": 1, "Shard, sizes inferred": 1, "Replicate": 1, "Partial": 1,
            "Shard, sizes given, validate=False": 0, "Shard, sizes inferred, validate=False": 1,
            "Replicate, validate=False": 0}, rep["collectives"]


def test_a_2d_mesh_infers_sizes_and_every_rank_hears_of_a_fault_outside_its_groups():
    reps = run_ranks(F.misuse_2d, 4, timeout=LONG, collective_timeout=LONG)
    for rep in reps:
        assert rep["right"] == (((3, 5), (2, 4)), (8, 6), ((3, 5), None), (8, 6))
    named = {
        "rows differ at one coordinate": "rank 3 (mesh coordinate (1, 1)) passed shape (6, 6)",
        "placements differ on rank 3": "rank 3 (mesh coordinate (1, 1)) passed [Shard(dim=0), "
                                       "Replicate()]",
        "dtype differs on rank 0": "rank 0 (mesh coordinate (0, 0)) passed a piece of dtype "
                                   "float64",
    }
    for name, what in named.items():
        got = [rep[name] for rep in reps]
        assert all(g is not None for g in got), (name, got)
        assert len({(kind, msg) for kind, msg, _ in got}) == 1, (name, got)
        assert got[0][0] == "LayoutError" and what in got[0][1], (name, got[0])
        assert max(s for _, _, s in got) < LONG / 5, (name, got)


def _records(n0: int, n1: int, change=None) -> list:
    """Records of an n0 x n1 mesh with [Shard(0), Replicate()] and rows 1 + coordinate 0;
    ``change(rank, fields)`` may edit one rank's fields."""
    from meshshard.shardtensor._aten.layout_exchange import Record

    out = []
    for rank in range(n0 * n1):
        c = divmod(rank, n1)
        f = dict(rank=rank, error=0, ndim=2, shape=(1 + c[0], 3), dtype="float32", device="cpu",
                 coord=c, placements=((1, 0, ""), (0, -1, "")), declared=(-1, -1))
        if change is not None:
            change(rank, f)
        out.append(Record(**f))
    return out


def test_the_verdict_on_a_large_mesh_names_the_one_rank_at_fault_in_one_short_line():
    """The judgement alone (no ranks): the records of 64 ranks survive encoding, give the
    sizes, and one odd rank among them is named with its coordinate; the line stays short."""
    from meshshard.shardtensor._aten.layout_exchange import Record, judge

    recs = _records(8, 8)
    assert [Record.decode(r.encode(), 2) for r in recs] == recs
    sizes, problem = judge(recs)
    assert problem is None and sizes == [tuple(range(1, 9)), None]

    def f64(rank, f):
        f["dtype"] = "float64" if rank == 37 else f["dtype"]

    def rows(rank, f):
        f["shape"] = (9, 3) if rank == 37 else f["shape"]

    for change, what in ((f64, "rank 37 (mesh coordinate (4, 5)) passed a piece of dtype "
                               "float64 where ranks 0, 1, 2, ..., 63 (63 ranks)"),
                         (rows, "rank 37 (mesh coordinate (4, 5)) passed shape (9, 3) where "
                                "ranks 32, 33, 34, ..., 39 (7 ranks) passed shape (5, 3)")):
        sizes, problem = judge(_records(8, 8, change))
        assert sizes is None and problem.ranks == (37,), problem
        assert what in problem.head and len(problem.head) < 300, problem.head
