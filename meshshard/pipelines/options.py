"""What preprocessing does with each run, as one typed, validated value: :class:`RunOptions`.

:func:`~meshshard.pipelines.preprocess_runs` builds it once (from its keywords, or takes one
built by the caller), checks it before any run is read, and hands the same frozen value to
every worker and to :func:`~meshshard.pipelines.process_run`; a store records
:meth:`RunOptions.request`, and a rerun with other options is told which ones changed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from meshshard.datasets.schema import DRIVAERML, DatasetSchema
from meshshard.partition.hypergraph import require_mtkahypar
from meshshard.partition.methods import list_methods

__all__ = ["GRAPHS", "STL_MODES", "RunOptions"]

#: the mesh graphs a store can hold beside its rows (:mod:`meshshard.datasets.graphstore`)
GRAPHS = ("dual",)
#: what a store keeps of the run's STL: all four arrays (PhysicsNeMo's layout), the triangle
#: mesh only (what the SDF of volume training and DoMINO read), or nothing
STL_MODES = ("full", "mesh", "none")
_STL_KEYS = {
    "full": ("stl_coordinates", "stl_faces", "stl_centers", "stl_areas"),
    "mesh": ("stl_coordinates", "stl_faces"),
    "none": (),
}


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How every run is preprocessed (one value for all runs, checked when made).

    Attributes
    ----------
    parts : int
        Shards per sample (>= 1).
    method : str
        Partition method, any name of :func:`~meshshard.partition.list_methods` (a method
        added with :func:`~meshshard.partition.register_method` too); ``"hypergraph"`` needs
        the ``hypergraph`` extra.
    surface, volume : bool
        Which parts of the run to store (at least one).
    halo_radius : float, optional
        Also store the halo routing for neighbours within this radius (> 0).
    overwrite : bool
        Replace a finished store made with other options (else that is an error).
    drop_nan : bool
        Drop cells with NaN fields instead of failing on them.
    max_volume_cells : int, optional
        Keep at most this many volume cells (>= 1).
    schema : DatasetSchema
        File names, fields and reference values of the dataset.
    compressor : {"lz4", "zstd", None}
        The stores' zarr codec.
    graph : {None, "dual"}
        ``"dual"``: also store the surface dual graph's shards; with a graph method
        (``"metis"``, ``"hypergraph"``, ...) the surface is then cut on that graph.
    stl : {None, "full", "mesh", "none"}
        What the store keeps of the run's STL: ``"full"`` (coordinates, faces, centres,
        areas), ``"mesh"`` (coordinates and faces: what the volume's SDF and DoMINO need) or
        ``"none"``. None (default): ``"full"`` when the volume is stored, ``"none"`` for a
        surface-only store (a surface model reads no STL; DoMINO on the surface needs
        ``"mesh"``).
    reference_area : float, optional
        Every run's reference area (m^2), recorded in its store; default: the run's
        ``geo_ref_<i>.csv`` ``aRef`` when it has one.

    Raises
    ------
    ValueError
        A bad value, named with what is allowed (``parts`` < 1, an unknown ``method`` or
        ``graph``, neither part, ``halo_radius`` <= 0, ``max_volume_cells`` < 1, and
        ``method="hypergraph"`` without its extra).

    Examples
    --------
    >>> RunOptions(parts=4, volume=False).request()["parts"]
    4
    >>> RunOptions(parts=0)
    Traceback (most recent call last):
    ...
    ValueError: parts=0 must be an integer >= 1
    """

    parts: int
    method: str = "hilbert"
    surface: bool = True
    volume: bool = True
    halo_radius: float | None = None
    overwrite: bool = False
    drop_nan: bool = False
    max_volume_cells: int | None = None
    schema: DatasetSchema = DRIVAERML
    compressor: str | None = "lz4"
    graph: str | None = None
    stl: str | None = None
    reference_area: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.parts, int) or self.parts < 1:
            msg = f"parts={self.parts!r} must be an integer >= 1"
            raise ValueError(msg)
        if self.method not in list_methods():
            msg = f"method={self.method!r} is not one of {tuple(list_methods())}"
            raise ValueError(msg)
        if self.method == "hypergraph":  # before any run is read: say which extra is missing
            try:
                require_mtkahypar()
            except ImportError as exc:
                raise ValueError(str(exc)) from exc
        if not (self.surface or self.volume):
            msg = "nothing to do: enable the surface, the volume or both"
            raise ValueError(msg)
        if self.halo_radius is not None and not self.halo_radius > 0:
            msg = f"halo_radius={self.halo_radius} must be > 0 (or None for no halo routing)"
            raise ValueError(msg)
        if self.max_volume_cells is not None and self.max_volume_cells < 1:
            msg = f"max_volume_cells={self.max_volume_cells} must be >= 1 (or None for all)"
            raise ValueError(msg)
        if self.reference_area is not None and not (
                math.isfinite(self.reference_area) and self.reference_area > 0):
            msg = f"reference_area={self.reference_area} must be a finite area > 0 (m^2)"
            raise ValueError(msg)
        if self.graph is not None and self.graph not in GRAPHS:
            msg = f"graph={self.graph!r} is not one of {GRAPHS} (or None for no graph)"
            raise ValueError(msg)
        if self.stl is not None and self.stl not in STL_MODES:
            msg = f"stl={self.stl!r} is not one of {STL_MODES} (or None: full with the volume)"
            raise ValueError(msg)

    def stl_mode(self) -> str:
        """``stl``, or its default: ``"full"`` with the volume, ``"none"`` without."""
        if self.stl is not None:
            return self.stl
        return "full" if self.volume else "none"

    def stl_keys(self) -> tuple[str, ...]:
        """The STL arrays a store keeps (:meth:`stl_mode`)."""
        return _STL_KEYS[self.stl_mode()]

    @classmethod
    def from_call(cls, who: str, options: RunOptions | None, keywords: dict[str, Any]
                  ) -> RunOptions:  # fmt: skip
        """The options of a call to ``who`` that took either a RunOptions or its fields as
        keywords.

        Raises
        ------
        TypeError
            An unknown keyword (naming the valid ones), ``parts`` missing, both a RunOptions
            and keywords, or ``options`` of another type.
        ValueError
            A bad value (see the class).
        """
        names = sorted(f.name for f in dataclasses.fields(cls))
        unknown = sorted(set(keywords) - set(names))
        if unknown:
            msg = f"{who}: unknown option(s) {unknown}; the options (RunOptions) are {names}"
            raise TypeError(msg)
        if options is None:
            if "parts" not in keywords:
                msg = f"{who}: parts (shards per sample) is required"
                raise TypeError(msg)
            return cls(**keywords)
        if not isinstance(options, cls):
            msg = f"{who}: options must be a RunOptions, got {type(options).__name__}"
            raise TypeError(msg)
        if keywords:
            msg = (f"{who}: pass a RunOptions or its fields as keywords, not both (got "
                   f"{sorted(keywords)}; use dataclasses.replace(options, ...))")
            raise TypeError(msg)
        return options

    def request(self) -> dict[str, Any]:
        """What a store records of the options that shape its content (a rerun with another
        request rewrites or refuses; ``overwrite`` and ``compressor`` are not in it)."""
        out = {
            "parts": self.parts,
            "method": self.method,
            "surface": bool(self.surface),
            "volume": bool(self.volume),
            "halo_radius": self.halo_radius,
            "drop_nan": bool(self.drop_nan),
            "max_volume_cells": self.max_volume_cells,
            "dataset": self.schema.to_json(),
        }
        if self.graph is not None:
            out["graph"] = self.graph
        if self.stl is not None and self.stl != ("full" if self.volume else "none"):
            out["stl"] = self.stl  # only when not the default: older stores stay up to date
        if self.reference_area is not None:
            out["reference_area"] = self.reference_area
        return out
