"""Integrated force coefficients and field errors from surface rows spread over ranks.

Forces, in OpenFOAM's conventions (:mod:`meshshard.datasets.conventions`: cell normals ``n``
point into the body, wall shear ``tau`` is the stress on the fluid), as the solver's ``forces``
function object sums them. With non-dimensional surface pressure ``p* = p / (rho U^2)`` and
wall shear ``tau* = tau / (rho U^2)`` on cells of area ``A``, the force on the body is
``F / (rho U^2) = sum_i (p*_i n_i - tau*_i) A_i``, and the coefficients are

    C_d = 2 F_x / (rho U^2 A_ref),   C_l = 2 F_z / (rho U^2 A_ref)

(free stream along +x, lift along +z, as in DrivaerML and OpenFOAM's motorBike). ``A_ref`` is
the reference area given by the user or carried by the data (DrivaerML's ``geo_ref_<i>.csv``),
else the frontal area of the body, ``0.5 sum_i |n_x,i| A_i`` (exact for a closed surface).
Sums are float64, formed per rank and all-reduced (collective when distributed).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["field_errors", "force_coefficients", "global_sums"]

PRESSURE = "pMeanTrim"
WALL_SHEAR = "wallShearStressMeanTrim"


def global_sums(a: np.ndarray, group: Any = None) -> np.ndarray:
    """``a`` (float64) summed over the ranks of ``group`` (identity on one process).
    Collective when distributed."""
    import torch
    import torch.distributed as dist

    a = np.asarray(a, dtype=np.float64)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return a
    t = torch.from_numpy(a.copy())
    if dist.get_backend(group) == "nccl":
        t = t.cuda()
    dist.all_reduce(t, group=group)
    return t.cpu().numpy()


def _force_sums(fields: np.ndarray, columns: dict, normals: np.ndarray, areas: np.ndarray):
    for name in (PRESSURE, WALL_SHEAR):
        if name not in columns:
            msg = f"drag and lift need the field {name!r} (fields present: {sorted(columns)})"
            raise ValueError(msg)
    a, _ = columns[PRESSURE]
    s0, s1 = columns[WALL_SHEAR]
    n = normals.astype(np.float64)
    A = areas.astype(np.float64)[:, None]
    p = fields[:, a : a + 1].astype(np.float64)
    tau = fields[:, s0:s1].astype(np.float64)
    pressure = (p * n * A).sum(axis=0)
    shear = (-tau * A).sum(axis=0)
    return np.concatenate([pressure, shear])


def force_coefficients(
    fields: np.ndarray,
    columns: dict,
    normals: np.ndarray,
    areas: np.ndarray,
    *,
    reference_area: float | None = None,
    group: Any = None,
) -> dict[str, float]:
    """Drag and lift coefficients (and their pressure and shear parts) of this rank's rows
    together with every other rank's. Collective when distributed.

    Parameters
    ----------
    fields : ndarray (n, F), non-dimensional; columns name -> [start, stop]
    normals : ndarray (n, 3), unit normals into the body; areas : ndarray (n,)
    reference_area : float, optional
        Default: the frontal area ``0.5 sum |n_x| A``.

    Returns
    -------
    dict with ``cd``, ``cl``, ``cd_pressure``, ``cd_shear``, ``cl_pressure``, ``cl_shear``,
    ``reference_area``.
    """
    local = np.concatenate([_force_sums(fields, columns, normals, areas),
                            [0.5 * float(np.sum(np.abs(normals[:, 0].astype(np.float64))
                                                * areas.astype(np.float64)))]])
    tot = global_sums(local, group)
    a_ref = float(tot[6]) if reference_area is None else float(reference_area)
    if not a_ref > 0:
        msg = f"reference area {a_ref} must be > 0"
        raise ValueError(msg)
    k = 2.0 / a_ref
    px, pz, sx, sz = tot[0], tot[2], tot[3], tot[5]
    return {"cd": k * (px + sx), "cl": k * (pz + sz), "cd_pressure": k * px,
            "cd_shear": k * sx, "cl_pressure": k * pz, "cl_shear": k * sz,
            "reference_area": a_ref}


def field_errors(pred: np.ndarray, true: np.ndarray, columns: dict, *, group: Any = None
                 ) -> dict[str, float]:
    """Relative L2 error ``||pred - true|| / ||true||`` per field over all ranks' rows
    (``nan`` for a field whose truth is zero everywhere). Collective when distributed."""
    names = sorted(columns)
    local = []
    for name in names:
        a, b = columns[name]
        d = pred[:, a:b].astype(np.float64) - true[:, a:b].astype(np.float64)
        local += [float((d * d).sum()), float((true[:, a:b].astype(np.float64) ** 2).sum())]
    tot = global_sums(np.asarray(local), group)
    out = {}
    for i, name in enumerate(names):
        num, den = tot[2 * i], tot[2 * i + 1]
        out[name] = float(np.sqrt(num / den)) if den > 0 else float("nan")
    return out
