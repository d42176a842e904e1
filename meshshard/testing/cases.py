"""Oracle test cases grouped by world size, each group run once on spawned ranks.

Spawning ranks is the slow part of a distributed test, so a test module lists its cases per
world size, runs all the cases of one world size in one :func:`run_ranks` call, and gives each
case its own pytest item that reads the cached results. :class:`RankCases` is that pattern:
the rank function takes the case list and returns one result per case, in order.

Example
-------
>>> def squares(rank, world_size, cases):  # module level: it must be picklable
...     return [c["n"] ** 2 + rank for c in cases]
>>> CASES = RankCases(squares, {2: [{"n": 3}, {"n": 4}]})
>>> CASES.params()
[(2, 0), (2, 1)]
>>> CASES.per_rank(2, 1)  # doctest: +SKIP
[16, 17]

In a test module::

    @pytest.mark.parametrize(("P", "ci"), CASES.params())
    def test_op_matches_oracle(P, ci):
        case, per_rank = CASES.case(P, ci), CASES.per_rank(P, ci)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from meshshard.testing.distributed import run_ranks

__all__ = ["RankCases"]

C = TypeVar("C")


class RankCases(Generic[C]):
    """Cases keyed by world size; each world size's cases run together once, on first use.

    Parameters
    ----------
    fn : callable
        ``fn(rank, world_size, cases) -> list``: a module-level (picklable) rank function that
        runs every case of ``cases`` and returns one picklable result per case, in order.
    cases : mapping of int to sequence
        World size -> the cases that run on that many ranks.
    **run_kw
        Passed on to :func:`run_ranks` (``timeout``, ``env``, ...).
    """

    def __init__(
        self,
        fn: Callable[..., Sequence[Any]],
        cases: Mapping[int, Sequence[C]],
        **run_kw: Any,
    ) -> None:
        self.fn = fn
        self.cases = {int(w): list(cs) for w, cs in cases.items()}
        self.run_kw = run_kw
        self._results: dict[int, list[Sequence[Any]]] = {}

    def params(self) -> list[tuple[int, int]]:
        """``(world_size, index)`` of every case, for ``pytest.mark.parametrize``."""
        return [(w, i) for w, cs in self.cases.items() for i in range(len(cs))]

    def case(self, world_size: int, index: int) -> C:
        """The case ``index`` of ``world_size``."""
        return self.cases[world_size][index]

    def per_rank(self, world_size: int, index: int) -> list[Any]:
        """Case ``index``'s result on each rank, in rank order.

        The first call for a world size runs all of its cases in one :func:`run_ranks` call
        (it raises :class:`~meshshard.testing.distributed.RankError` when a rank fails); later
        calls read the cached results.
        """
        if world_size not in self._results:
            cases = self.cases[world_size]
            self._results[world_size] = run_ranks(self.fn, world_size, cases, **self.run_kw)
        return [results[index] for results in self._results[world_size]]
