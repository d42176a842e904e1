"""Physical conventions of surface data: which way the normals point, which side's shear.

meshshard holds every surface in **OpenFOAM's conventions**, the ones DrivaerML (computed with
OpenFOAM) and the solver's own ``forces`` function object use:

- cell normals point **out of the fluid, into the body** (OpenFOAM orders every boundary face
  so that its area vector ``S_f`` leaves the domain);
- wall shear stress is the stress **on the fluid** (OpenFOAM's ``wallShearStress`` is
  ``-(S_f / |S_f|) . R_eff``);
- so the force on the body is ``F = sum_i (p_i n_i - tau_i) A_i`` (kinematic ``p`` and
  ``tau`` times ``rho``), which is what ``forces.C`` sums: ``S_f p`` and ``S_f . devRhoReff``.

PhysicsNeMo's DrivaerML examples integrate drag the same way (``p n_x A - tau_x A`` with the
file's normals).

A file may hold other conventions. The normals' orientation is read from the closed surface
itself: with normals into the body the divergence theorem gives a *negative* signed volume
``V = (1/3) sum_i (c_i - c) . n_i A_i`` (outward normals: positive). ``normals="auto"`` takes
the orientation from that sign and flips the normals when the file's point out of the body;
a surface too open to tell (``|sum n A| / sum A`` above :data:`MAX_OPENNESS`, or a volume
near zero) is an error asking for ``normals="into_body"`` or ``"out_of_body"``. The shear's
side cannot be read from the data: ``shear="on_fluid"`` (OpenFOAM, DrivaerML; the default)
or ``"on_body"`` (its negative) states it, and ``on_body`` shear is negated on reading.

What was found and done travels with the data (:func:`record`): into the store's attributes,
the model file and every report.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "CANONICAL",
    "MAX_OPENNESS",
    "NORMALS",
    "SHEAR",
    "check_conventions",
    "orientation",
    "record",
    "signed_volume",
]

#: what a file's normals may be said to be (``auto``: from the signed volume)
NORMALS = ("auto", "into_body", "out_of_body")
#: which side's stress a file's wall shear is
SHEAR = ("on_fluid", "on_body")
#: the conventions meshshard holds data in (OpenFOAM's)
CANONICAL = {"normals": "into_body", "shear": "on_fluid"}
#: above this ``|sum n A| / sum A`` a surface is too open for ``normals="auto"``
MAX_OPENNESS = 0.05
#: below this ``|V| / (sum A)^1.5`` the signed volume does not tell the orientation
_MIN_VOLUME = 1e-4


def check_conventions(normals: str, shear: str) -> None:
    """Raise a one-line ValueError for an unknown ``normals`` or ``shear`` value."""
    if normals not in NORMALS:
        msg = f"normals={normals!r} is not one of {NORMALS}"
        raise ValueError(msg)
    if shear not in SHEAR:
        msg = f"shear={shear!r} is not one of {SHEAR}"
        raise ValueError(msg)


def signed_volume(centers: np.ndarray, normals: np.ndarray, areas: np.ndarray
                  ) -> tuple[float, float]:
    """``(V, openness)`` of a surface of cells (float64): the signed enclosed volume
    ``(1/3) sum (c_i - c) . n_i A_i`` about the area-weighted centre ``c`` (negative when the
    normals point into the body), and ``|sum n_i A_i| / sum A_i`` (0 for a closed surface)."""
    a = np.asarray(areas, dtype=np.float64)
    total = float(a.sum())
    if not total > 0:
        return 0.0, 1.0
    c = np.asarray(centers, dtype=np.float64)
    s = np.asarray(normals, dtype=np.float64) * a[:, None]
    mid = (c * a[:, None]).sum(axis=0) / total
    vol = float(np.einsum("ij,ij->", c - mid, s)) / 3.0
    return vol, float(np.linalg.norm(s.sum(axis=0)) / total)


def orientation(path: object, centers: np.ndarray, normals: np.ndarray, areas: np.ndarray,
                stated: str = "auto") -> dict:
    """Which way ``normals`` point (``stated``, else from the signed volume) and whether they
    must be flipped to point into the body.

    Returns
    -------
    dict
        ``file_normals`` (``into_body``/``out_of_body``), ``flip`` (bool), ``from``
        (``"signed volume"`` or ``"stated"``), ``signed_volume``, ``openness``.

    Raises
    ------
    ValueError
        ``stated="auto"`` on a surface too open (or flat) to tell; names ``path`` and the fix.
    """
    a64 = np.asarray(areas, dtype=np.float64)
    if stated == "auto" and not (np.isfinite(a64).all() and a64.sum() > 0):
        # no area to judge by (non-finite, or all underflowed to 0 in float32: a mesh in the
        # wrong units): the geometry checks that follow name the cause
        return {"file_normals": CANONICAL["normals"], "flip": False,
                "from": "not checked (bad areas)", "signed_volume": float("nan"),
                "openness": float("nan")}
    vol, openness = signed_volume(centers, normals, areas)
    total = float(a64.sum())
    if stated == "auto":
        if openness > MAX_OPENNESS or abs(vol) < _MIN_VOLUME * max(total, 1e-300) ** 1.5:
            msg = (f"{path}: cannot tell which way the normals point (|sum n A| / sum A = "
                   f"{openness:.3g}, signed volume {vol:.3g}): the surface is not closed; "
                   "state it with --normals into-body or --normals out-of-body")
            raise ValueError(msg)
        found, how = ("into_body" if vol < 0 else "out_of_body"), "signed volume"
    else:
        found, how = stated, "stated"
    return {"file_normals": found, "flip": found != CANONICAL["normals"], "from": how,
            "signed_volume": vol, "openness": openness}


def record(found: dict | None, shear: str) -> dict:
    """The conventions record stored with the data: the canonical ones the data now holds,
    and what the file held (``found``: :func:`orientation`'s result, None when not checked)."""
    out = dict(CANONICAL)
    out["file_shear"] = shear
    if found is not None:
        out.update({k: found[k] for k in ("file_normals", "from", "signed_volume", "openness")})
    return out
