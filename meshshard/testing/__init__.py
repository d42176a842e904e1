"""Test helpers shipped with meshshard (used by its own tests and by downstream users)."""

from meshshard.testing.cases import RankCases
from meshshard.testing.distributed import RankError, run_ranks

__all__ = ["RankCases", "RankError", "run_ranks"]
