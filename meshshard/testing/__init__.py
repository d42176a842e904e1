"""Test helpers shipped with meshshard (used by its own tests and by downstream users)."""

from meshshard.testing.distributed import RankError, run_ranks

__all__ = ["RankError", "run_ranks"]
