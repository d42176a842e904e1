"""PNGs of ``predict`` (pressure on the car) and ``evaluate`` (drag across runs, error spread)."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from meshshard.io.vtklog import capture_vtk_output

__all__ = ["evaluate_png", "pressure_png", "r_squared"]

log = logging.getLogger(__name__)

P = "pMeanTrim"


def pressure_png(vtk: Path, png: Path, *, truth: bool = True) -> Path:
    """Predicted pressure, true pressure and their difference, side by side (off-screen)."""
    import pyvista as pv

    mesh = pv.read(vtk)
    data = mesh.cell_data if f"{P}Pred" in mesh.cell_data else mesh.point_data
    panels = [(f"{P}Pred", "predicted p")]
    if truth and P in data:
        data["pDifference"] = np.asarray(data[f"{P}Pred"]) - np.asarray(data[P])
        panels += [(P, "true p"), ("pDifference", "predicted - true")]
    lo, hi = np.nanpercentile(np.asarray(data[f"{P}Pred"]), [1, 99])
    if truth and P in data:
        lo2, hi2 = np.nanpercentile(np.asarray(data[P]), [1, 99])
        lo, hi = min(lo, lo2), max(hi, hi2)
    # VTK's "bad X server connection" before it falls back to EGL is captured, not printed
    with capture_vtk_output():
        pl = pv.Plotter(off_screen=True, shape=(1, len(panels)),
                        window_size=(520 * len(panels), 420))
        points = mesh.n_cells == 0 or mesh.n_cells == mesh.n_verts
        for j, (name, title) in enumerate(panels):
            pl.subplot(0, j)
            clim = (lo, hi)
            if name == "pDifference":
                m = float(np.nanpercentile(np.abs(np.asarray(data[name])), 99)) or 1.0
                clim = (-m, m)
            pl.add_mesh(mesh.copy(deep=False), scalars=name, clim=clim,
                        cmap="coolwarm" if name == "pDifference" else "viridis",
                        render_points_as_spheres=points, point_size=3,
                        scalar_bar_args={"title": title, "fmt": "%.3g"})
            pl.add_text(title, font_size=10)
            pl.view_isometric()
        pl.link_views()
        png.parent.mkdir(parents=True, exist_ok=True)
        pl.screenshot(str(png))
        pl.close()
    return png


def r_squared(pred: np.ndarray, true: np.ndarray) -> float:
    """``1 - SS_res / SS_tot``; nan with fewer than 2 runs or no spread in the truth."""
    pred, true = np.asarray(pred, dtype=float), np.asarray(true, dtype=float)
    if true.size < 2:
        return float("nan")
    ss_tot = float(((true - true.mean()) ** 2).sum())
    if ss_tot == 0:
        return float("nan")
    return 1.0 - float(((pred - true) ** 2).sum()) / ss_tot


def evaluate_png(rows: list[dict], png: Path) -> Path:
    """Left: predicted against true drag across runs (R^2 in the title); right: the relative
    L2 error of each field across runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4.2), dpi=120)
    cd_t = np.array([r["cd_true"] for r in rows])
    cd_p = np.array([r["cd_pred"] for r in rows])
    r2 = r_squared(cd_p, cd_t)
    ax.scatter(cd_t, cd_p, s=30)
    lo, hi = float(min(cd_t.min(), cd_p.min())), float(max(cd_t.max(), cd_p.max()))
    pad = 0.05 * (hi - lo or abs(hi) or 1.0)
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], "k--", linewidth=1)
    ax.set_xlabel("true $C_d$")
    ax.set_ylabel("predicted $C_d$")
    ax.set_title(f"drag over {len(rows)} run(s): R$^2$ = "
                 + ("n/a" if math.isnan(r2) else f"{r2:.3f}"))
    names = sorted({k for r in rows for k in r["rel_l2"]})
    vals = [[r["rel_l2"][n] for r in rows if n in r["rel_l2"]] for n in names]
    bx.boxplot(vals, showmeans=True)
    bx.set_xticks(range(1, len(names) + 1), names, rotation=15, fontsize=8)
    bx.set_ylabel("relative L2 error")
    bx.set_title("error per field across runs")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    plt.close(fig)
    return png
