"""The reference area of a source for drag and lift, and where it came from.

Run directories: ``--reference-area``, else the run's ``geo_ref_<i>.csv``
(:mod:`meshshard.datasets.reference`). Stores: ``--reference-area``, else the reference the
store recorded when it was written (``attrs["reference"]``). Otherwise the caller estimates
the frontal area, and a warning says so: coefficients on an estimated area are not comparable
with the solver's.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from meshshard.datasets.reference import geo_ref_path, read_geo_ref, run_reference
from meshshard.store.format import StoreError, open_store

__all__ = ["ESTIMATED", "geo_ref_path", "read_geo_ref", "reference_area_for"]

log = logging.getLogger(__name__)

#: ``reference_area_from`` when no reference area was given or recorded
ESTIMATED = "frontal area (estimate)"


def _store_reference(source: Path) -> dict | None:
    if not (source / "zarr.json").is_file():
        return None
    try:
        _, attrs = open_store(source)
    except (StoreError, OSError, ValueError):  # a curator store or another zarr: none recorded
        return None
    ref = attrs.get("reference")
    return ref if isinstance(ref, dict) and ref.get("aRef") else None


def reference_area_for(source: str | Path, given: float | None) -> tuple[float | None, str]:
    """``(A_ref, where it came from)``: ``given`` (the option), else a run directory's
    ``geo_ref_<i>.csv`` ``aRef`` or a store's recorded one, else ``(None, ESTIMATED)`` with a
    warning (the caller computes the frontal area).

    Raises
    ------
    ValueError
        A bad ``geo_ref`` file (named), or ``given`` not finite and > 0.
    """
    p = Path(source)
    if given is not None:
        if not (math.isfinite(given) and given > 0):
            msg = f"--reference-area {given}: must be a finite area > 0 (m^2)"
            raise ValueError(msg)
        return float(given), "--reference-area"
    ref = run_reference(p) if geo_ref_path(p) is not None else _store_reference(p)
    if ref is not None:
        return float(ref["aRef"]), f"{ref.get('from', 'store')}" + (
            " (recorded in the store)" if geo_ref_path(p) is None else "")
    log.warning("%s: no reference area (no --reference-area, no geo_ref_<i>.csv, none "
                "recorded in a store): Cd and Cl use the estimated frontal area 0.5 sum |n_x| A, "
                "not comparable with the solver's coefficients", p)
    return None, ESTIMATED
