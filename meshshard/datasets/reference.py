"""A run's reference values: DrivaerML's ``geo_ref_<i>.csv``, or the value the user gave.

DrivaerML ships, next to ``boundary_<i>.vtp``, a one-row CSV ``geo_ref_<i>.csv`` whose header
names the run's reference quantities; ``aRef`` (reference area, m^2) and ``lRef`` (reference
length, m) are the ones drag/lift use. That is how PhysicsNeMo's DrivaerML examples read it
(``float(row["aRef"])`` of the single row). The real files were not available here: the
reader takes any extra columns, and needs one data row with a finite ``aRef > 0``.

:func:`run_reference` is what preprocessing stores (``attrs["reference"]``), so that a store
remembers its reference area; ``predict``/``evaluate`` read it back
(:func:`meshshard.apps.reference.reference_area_for`).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

__all__ = ["geo_ref_path", "read_geo_ref", "run_reference"]


def geo_ref_path(source: str | Path) -> Path | None:
    """``<run>/geo_ref_<i>.csv`` for a run directory ``run_<i>`` (else the single
    ``geo_ref_*.csv`` in it), or None (a store, or no such file)."""
    p = Path(source)
    if not p.is_dir():
        return None
    i = p.name.removeprefix("run_")
    cand = p / f"geo_ref_{i}.csv"
    if cand.is_file():
        return cand
    found = sorted(p.glob("geo_ref_*.csv"))
    return found[0] if len(found) == 1 else None


def read_geo_ref(path: str | Path) -> dict[str, float]:
    """The numeric columns of the one data row of ``path`` (``aRef`` checked: finite, > 0)."""
    path = Path(path)
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    if len(rows) != 1:
        msg = f"{path}: expected one data row under the header, found {len(rows)}"
        raise ValueError(msg)
    out: dict[str, float] = {}
    for k, v in rows[0].items():
        if k is None or v is None:
            msg = f"{path}: the data row and the header have different numbers of columns"
            raise ValueError(msg)
        try:
            out[k.strip()] = float(v)
        except ValueError:
            continue  # a text column: not a reference value
    a = out.get("aRef")
    if a is None or not math.isfinite(a) or a <= 0:
        msg = f"{path}: needs a column aRef (reference area, m^2) with a finite value > 0"
        raise ValueError(msg)
    return out


def run_reference(run_dir: str | Path, reference_area: float | None = None) -> dict | None:
    """The reference values a store records for ``run_dir``: ``{"aRef", "from", ...}`` from
    ``reference_area`` (the option wins), else the run's ``geo_ref_<i>.csv`` (every numeric
    column, ``lRef`` among them), else None.

    Raises
    ------
    ValueError
        A bad ``geo_ref`` file (named), or ``reference_area`` not finite and > 0.
    """
    p = geo_ref_path(run_dir)
    values = read_geo_ref(p) if p is not None else {}
    if reference_area is not None:
        if not (math.isfinite(reference_area) and reference_area > 0):
            msg = f"--reference-area {reference_area}: must be a finite area > 0 (m^2)"
            raise ValueError(msg)
        return {**values, "aRef": float(reference_area), "from": "--reference-area"}
    if p is None:
        return None
    return {**values, "from": p.name}
