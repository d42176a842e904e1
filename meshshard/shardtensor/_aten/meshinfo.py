"""Mesh helpers of the rules: this rank's coordinate and group names (cached per mesh), and
the collective checker's hook. Below the rules and the halo code, which both use them."""

from __future__ import annotations

import torch

from meshshard.comm.check import check_collective, debug_enabled

__all__ = ["check", "coord"]

_COORD: dict[int, tuple] = {}


def coord(mesh) -> tuple:
    """(mesh, this rank's coordinate, each mesh dim's group name), cached per mesh."""
    c = _COORD.get(id(mesh))
    if c is None or c[0] is not mesh:
        c = _COORD[id(mesh)] = (mesh, tuple(mesh.get_coordinate()),
                                tuple(mesh.get_group(i).group_name for i in range(mesh.ndim)))
    return c


def check(op: str, mesh, i: int, t: torch.Tensor, detail: str,
          varying_dim: int | None = None) -> None:
    """``MESHSHARD_DEBUG_COLLECTIVES``: every rank of mesh dim ``i`` agrees on the collective
    about to run, else each names the diverging rank and call. Eager only (a compiled graph
    runs its collectives as traced, on every rank alike)."""
    if debug_enabled() and type(t) is torch.Tensor and not torch.compiler.is_compiling():
        check_collective(op, mesh.get_group(i), t, varying_dim=varying_dim, detail=detail)
