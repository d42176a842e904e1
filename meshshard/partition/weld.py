"""Coincident points merged (welded) before cells are matched by their points.

The dual graph pairs cells that list the same points. A file in which parts of the mesh carry
their own copies of the points they share breaks that: OpenFOAM's ``foamToVTK`` gives every
boundary patch its own points (motorBike's surface: 68,982 points, 50,500 distinct), and the
surface's dual graph falls apart into one piece per patch, which METIS then cuts for free.
:func:`weld_points` maps every point to the lowest-numbered point within a tolerance of it;
the tolerance is relative to the mesh's shortest edge, so it never joins two points of a cell.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["DEFAULT_WELD", "Weld", "weld_points"]

#: default tolerance, relative to the shortest edge of the mesh
DEFAULT_WELD = 1e-6


@dataclass(frozen=True)
class Weld:
    """Which point each point was merged into.

    Attributes
    ----------
    representative : ndarray of shape (n_points,), int64
        The lowest-numbered point within the tolerance (chains of close points included).
    merged : int
        Points that are copies of another (``n_points`` minus the distinct points).
    tolerance : float
        Absolute distance used.
    relative : float
        ``tolerance`` / ``shortest_edge`` (0 when an absolute tolerance was given).
    shortest_edge : float
        Shortest non-zero edge of the cells.
    """

    representative: np.ndarray
    merged: int
    tolerance: float
    relative: float
    shortest_edge: float

    @property
    def n_points(self) -> int:
        return int(self.representative.size)

    def apply(self, ids: Any) -> np.ndarray:
        """Point ids (any shape) mapped to their representatives."""
        return self.representative[np.asarray(ids, dtype=np.int64)]

    def as_dict(self) -> dict[str, Any]:
        """The report entry: points before and after, merged, and the tolerance."""
        return {
            "points": self.n_points,
            "distinct": self.n_points - self.merged,
            "merged": self.merged,
            "tolerance": self.tolerance,
            "relative_to_shortest_edge": self.relative,
            "shortest_edge": self.shortest_edge,
        }

    def describe(self) -> str:
        """One line for people."""
        rel = ""
        if self.relative:
            rel = f" = {self.relative:g} x shortest edge {self.shortest_edge:.3g}"
        return (
            f"{self.merged:,} coincident points merged ({self.n_points:,} -> "
            f"{self.n_points - self.merged:,}; tolerance {self.tolerance:.3g}{rel})"
        )


def shortest_edge(points: np.ndarray, conn: np.ndarray, offsets: np.ndarray) -> float:
    """The shortest non-zero distance between consecutive points of a cell (its edges for
    polygons; for 3-D cells some diagonals too, which are longer than the edges); ``inf``
    without any."""
    conn = np.asarray(conn, dtype=np.int64)
    off = np.asarray(offsets, dtype=np.int64)
    if conn.size < 2:
        return float("inf")
    nxt = np.roll(conn, -1)
    last = off[1:] - 1  # each cell's last point closes on its first
    keep = np.diff(off) > 1
    nxt[last[keep]] = conn[off[:-1][keep]]
    pts = np.asarray(points)
    d2 = np.zeros(conn.size)
    for k in range(pts.shape[1]):  # one coordinate at a time: small temporaries
        c = pts[:, k].astype(np.float64)
        diff = c[conn] - c[nxt]
        d2 += diff * diff
    d2 = d2[d2 > 0]
    return float(np.sqrt(d2.min())) if d2.size else float("inf")


def weld_points(
    points: Any,
    conn: Any,
    offsets: Any,
    *,
    relative: float = DEFAULT_WELD,
    tolerance: float | None = None,
) -> Weld:
    """Merge points closer than ``relative`` x the shortest edge (or ``tolerance``).

    Parameters
    ----------
    points : array of shape (n_points, 3)
    conn, offsets : int arrays
        The cells' flat connectivity and offsets (for the shortest edge).
    relative : float
        Tolerance as a fraction of the shortest edge (> 0, < 0.5).
    tolerance : float, optional
        An absolute tolerance instead (>= 0; 0 merges exact copies only).

    Returns
    -------
    Weld

    Raises
    ------
    ValueError
        A tolerance out of range, named with the allowed values.

    Examples
    --------
    Two triangles whose shared edge is stored twice (points 2, 3 copy 1, 0):

    >>> import numpy as np
    >>> pts = np.array([[0, 0, 0], [1, 0, 0], [1, 0, 0], [0, 0, 0], [0, 1, 0], [1, -1, 0]], float)
    >>> w = weld_points(pts, [0, 1, 4, 2, 3, 5], [0, 3, 6])
    >>> w.merged, w.apply([2, 3, 5]).tolist()
    (2, [1, 0, 5])
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components
    from scipy.spatial import cKDTree

    pts = np.asarray(points, dtype=np.float64)
    n = pts.shape[0]
    edge = shortest_edge(pts, np.asarray(conn), np.asarray(offsets))
    if tolerance is not None:
        if not np.isfinite(tolerance) or tolerance < 0:
            msg = f"tolerance={tolerance!r} must be a finite distance >= 0"
            raise ValueError(msg)
        tol, rel = float(tolerance), 0.0
    else:
        if not (np.isfinite(relative) and 0 < relative < 0.5):
            msg = (
                f"relative={relative!r} must be > 0 and < 0.5 (a fraction of the shortest edge; "
                f"default {DEFAULT_WELD:g})"
            )
            raise ValueError(msg)
        if not np.isfinite(edge):  # no edges: relative to the bounding box instead
            span = float(np.linalg.norm(np.ptp(pts, axis=0))) if n else 0.0
            edge = span if span > 0 else 1.0
        tol, rel = relative * edge, float(relative)
    rep = np.arange(n, dtype=np.int64)
    if n > 1:
        tree = cKDTree(pts, balanced_tree=False, compact_nodes=False)  # ~3x faster to build
        pairs = tree.query_pairs(tol, output_type="ndarray")
        if pairs.size:
            g = coo_matrix((np.ones(len(pairs), np.int8), (pairs[:, 0], pairs[:, 1])), (n, n))
            _, label = connected_components(g, directed=False)
            first = np.full(label.max() + 1, n, dtype=np.int64)
            np.minimum.at(first, label, rep)
            rep = first[label]
    merged = int(n - np.count_nonzero(rep == np.arange(n)))  # a component's lowest id is its own
    return Weld(rep, merged, tol, rel, float(edge) if np.isfinite(edge) else 0.0)
