"""The memory budgets of ``predict`` and ``evaluate``: three bounds, one number by default.

A run is predicted in streamed phases; each is bounded by its own budget, named for what it
bounds:

- ``max_points_per_chunk``: points per chunk of the model's forward on every rank
  (:func:`~meshshard.apps.chunked.chunked_forward`). Memory beyond the inputs and the output:
  one chunk's activations (at 65,536 points, Transolver with 32 hidden and 2 layers: about
  160 MB, ``benchmarks/bench_predict.py``). Each chunk runs the whole model once, so the CLI
  refuses fewer than :data:`MIN_POINTS_PER_CHUNK`.
- ``max_queries_per_chunk``: kNN queries per round of the surface features on every rank
  (:func:`~meshshard.apps.features.chunked_inputs` through :func:`meshshard.ops.knn_chunks`).
  Memory: one round's candidates, neighbour rows and features (at 65,536 queries and k = 8:
  about 190 MB in the same bench), instead of about 0.9 KB per point of the whole shard.
- ``max_cells_per_round``: volume cell centres per round of the signed distances to the body
  on every rank (:func:`~meshshard.apps.volume_inputs.distances`). Memory: one round's queries
  and their candidate triangles (not measured).

``None`` for a budget runs that phase whole (the unchunked reference). The CLI's
``--max-points-per-chunk`` (default :data:`DEFAULT_BUDGET`) sets all three unless
``--max-queries-per-chunk`` or ``--max-cells-per-round`` say otherwise; in Python the same rule
is :meth:`ChunkBudgets.of`. None of the budgets changes the results: the chunked phases are
exact (``tests/apps/test_chunk_budgets.py``).

This module imports nothing heavy: the CLI builds its parser from it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["DEFAULT_BUDGET", "DEMO_BUDGET", "MIN_POINTS_PER_CHUNK", "ChunkBudgets"]

#: the one number ``predict`` and ``evaluate`` use for all three budgets unless told otherwise
DEFAULT_BUDGET = 1 << 18
#: the demo's: its ~100,000 surface cells per rank then run in two chunks, so the demo shows
#: chunked inference (and the streamed kNN) at work
DEMO_BUDGET = 1 << 16
#: the smallest ``max_points_per_chunk`` the CLI accepts: below it the model's per-call
#: overhead dominates (1 point per chunk ran for hours)
MIN_POINTS_PER_CHUNK = 256


@dataclass(frozen=True)
class ChunkBudgets:
    """The three budgets of one prediction (each ``None``: that phase runs whole).

    Parameters
    ----------
    max_points_per_chunk : int or None
        Points per chunk of the model's forward, per rank.
    max_queries_per_chunk : int or None
        kNN queries per round of the surface features, per rank.
    max_cells_per_round : int or None
        Volume cells per round of the signed distances, per rank.
    """

    max_points_per_chunk: int | None = DEFAULT_BUDGET
    max_queries_per_chunk: int | None = DEFAULT_BUDGET
    max_cells_per_round: int | None = DEFAULT_BUDGET

    @classmethod
    def of(cls, max_points_per_chunk: int | None = DEFAULT_BUDGET,
           max_queries_per_chunk: int | None = None,
           max_cells_per_round: int | None = None) -> ChunkBudgets:
        """The budgets from one number: ``max_queries_per_chunk`` and ``max_cells_per_round``
        that are ``None`` follow ``max_points_per_chunk`` (so ``ChunkBudgets.of(None)`` is the
        unchunked reference).

        >>> ChunkBudgets.of(4096, max_cells_per_round=512)
        ChunkBudgets(max_points_per_chunk=4096, max_queries_per_chunk=4096, max_cells_per_round=512)
        """
        def follow(v: int | None) -> int | None:
            return max_points_per_chunk if v is None else v

        return cls(max_points_per_chunk, follow(max_queries_per_chunk),
                   follow(max_cells_per_round))

    def as_dict(self) -> dict[str, Any]:
        """The three budgets by name (for a run's ``prediction.json``)."""
        return asdict(self)
