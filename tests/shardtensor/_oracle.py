"""Shared by the multi-rank oracle tests: one spawn of ranks that the tests of a file (or of
several files) read, and the comparison of a sharded result with one process's."""

from __future__ import annotations

import torch

from meshshard.testing import run_ranks

_SPAWNS: dict = {}


def ranks_once(fn, world: int, *args, **kwargs) -> list:
    """``run_ranks(fn, world, *args, **kwargs)``, run once per test process for the same
    arguments: every test that reads these reports shares the one spawn."""
    key = (fn, world, repr(args), repr(sorted(kwargs.items())))
    if key not in _SPAWNS:
        _SPAWNS[key] = run_ranks(fn, world, *args, **kwargs)
    return _SPAWNS[key]


def together(rank: int, world: int, jobs: dict) -> dict:
    """Rank function running several in one spawn, in order: ``jobs`` is {name: (fn, *args)};
    returns {name: fn(rank, world, *args)}."""
    return {name: fn(rank, world, *args) for name, (fn, *args) in jobs.items()}


def _tensor(v) -> torch.Tensor:
    return torch.as_tensor(v, dtype=torch.float64) if isinstance(v, float) else torch.as_tensor(v)


def close(got, want, what: str, rtol: float = 1e-10, scale: float = 0.0,
          floor: float = 0.0) -> None:
    """``got`` equals one process's ``want``: within ``rtol`` elementwise, plus ``rtol`` of the
    larger of ``want``'s largest magnitude and ``scale`` (an entry that is zero in exact
    arithmetic is rounding noise on both sides) plus ``floor``; integer and bool tensors
    exactly."""
    assert got is not None and want is not None, f"{what}: missing"
    got, want = _tensor(got), _tensor(want)
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    if not want.dtype.is_floating_point:
        assert got.dtype == want.dtype and torch.equal(got, want), f"{what}: {got} != {want}"
        return
    atol = rtol * max(float(want.abs().max()) if want.numel() else 0.0, scale) + floor
    torch.testing.assert_close(got.to(want.dtype), want, rtol=rtol, atol=atol,
                               msg=lambda m: f"{what}: {m}")
