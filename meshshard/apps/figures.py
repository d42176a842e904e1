"""PNGs of ``predict`` (pressure on the car) and ``evaluate`` (drag across runs, error spread)."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from meshshard.io.vtklog import capture_vtk_output

__all__ = ["evaluate_png", "pressure_error", "pressure_png", "r2_caveat", "r_squared"]

log = logging.getLogger(__name__)

P = "pMeanTrim"


#: what the pressure arrays hold: DrivaerML's ``pMeanTrim`` is kinematic, ``p / rho``
P_UNITS = "m²/s² (p/ρ)"
_BAR = {f"{P}Pred": "predicted", P: "true", "pDifference": "difference"}


def pressure_error(data) -> tuple[float, float]:
    """``(||pred - true|| / ||true||, 99th percentile of |pred - true|)`` of the pressure over
    the cells where both are finite."""
    pred, true = np.asarray(data[f"{P}Pred"], float), np.asarray(data[P], float)
    ok = np.isfinite(pred) & np.isfinite(true)
    diff = pred[ok] - true[ok]
    rel = float(np.linalg.norm(diff) / max(float(np.linalg.norm(true[ok])), 1e-30))
    return rel, float(np.percentile(np.abs(diff), 99)) if diff.size else float("nan")


def _render_panels(mesh, data, panels, lo: float, hi: float) -> np.ndarray:
    """The panels side by side off-screen (an RGB image); each panel's colour bar is vertical
    on its right, its title above the bar, so the title never runs into the tick labels."""
    import pyvista as pv

    # VTK's "bad X server connection" before it falls back to EGL is captured, not printed
    with capture_vtk_output():
        pl = pv.Plotter(off_screen=True, shape=(1, len(panels)),
                        window_size=(560 * len(panels), 440))
        points = mesh.n_cells == 0 or mesh.n_cells == mesh.n_verts
        for j, (name, title) in enumerate(panels):
            pl.subplot(0, j)
            clim = (lo, hi)
            if name == "pDifference":
                m = float(np.nanpercentile(np.abs(np.asarray(data[name])), 99)) or 1.0
                clim = (-m, m)
            # one bar per panel: pyvista shares a bar between meshes with the same title
            bar = {"title": f"{_BAR[name]}\nm²/s²", "fmt": "%.3g", "vertical": True,
                   "position_x": 0.82,
                   "position_y": 0.12, "width": 0.07, "height": 0.68, "title_font_size": 14,
                   "label_font_size": 12, "n_labels": 5}
            pl.add_mesh(mesh.copy(deep=False), scalars=name, clim=clim,
                        cmap="coolwarm" if name == "pDifference" else "viridis",
                        render_points_as_spheres=points, point_size=3,
                        scalar_bar_args=bar)
            pl.add_text(title, font_size=11, position="upper_left")
            pl.view_vector((-1.0, -0.9, 0.7), viewup=(0.0, 0.0, 1.0))  # the front (flow +x)
        pl.link_views()
        img = pl.screenshot(None, return_img=True)
        pl.close()
    return np.asarray(img)


def pressure_png(vtk: Path, png: Path, *, truth: bool = True, run: str | None = None) -> Path:
    """Predicted pressure, true pressure and their difference, side by side (off-screen), under
    a title naming the run (default: the VTK file's directory), the units and, with the truth,
    the error (relative L2 and 99th percentile of the absolute difference)."""
    import matplotlib
    import pyvista as pv

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mesh = pv.read(vtk)
    data = mesh.cell_data if f"{P}Pred" in mesh.cell_data else mesh.point_data
    panels = [(f"{P}Pred", "predicted p")]
    truth = truth and P in data
    if truth:
        data["pDifference"] = np.asarray(data[f"{P}Pred"]) - np.asarray(data[P])
        panels += [(P, "true p"), ("pDifference", "predicted - true")]
    lo, hi = np.nanpercentile(np.asarray(data[f"{P}Pred"]), [1, 99])
    if truth:
        lo2, hi2 = np.nanpercentile(np.asarray(data[P]), [1, 99])
        lo, hi = min(lo, lo2), max(hi, hi2)
    img = _render_panels(mesh, data, panels, float(lo), float(hi))
    run = run or Path(vtk).parent.name
    head = f"{run}: surface pressure p = {P} in {P_UNITS}, the model's prediction"
    if truth:
        rel, p99 = pressure_error(data)
        head += (f" against the truth\nrelative L2 error {rel:.3f}; 99% of the cells within "
                 f"{p99:.3g} m²/s² of the truth")
    h, w = img.shape[:2]
    fig = plt.figure(figsize=(w / 100, h / 100 + 0.6), dpi=100)
    ax = fig.add_axes((0, 0, 1, h / (h + 60)))
    ax.imshow(img)
    ax.axis("off")
    fig.suptitle(head, fontsize=12, y=0.995, va="top")
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    plt.close(fig)
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


def r2_caveat(pred, true) -> str | None:
    """One line on what the R^2 of predicted drag ``pred`` against true drag ``true`` (one
    value per run) can say, or None when it speaks for itself (R^2 >= 0 over 3 runs or more).
    A negative R^2 is explained: a shared bias larger than the runs' spread, or errors larger
    than that spread."""
    pred, true = np.asarray(pred, dtype=float), np.asarray(true, dtype=float)
    n, r2 = true.size, r_squared(pred, true)
    if math.isnan(r2):
        return f"R^2 is undefined over {n} run(s): it needs 2 runs or more of different drag"
    if r2 < 0:
        bias, spread = float(np.mean(pred - true)), float(np.std(true))
        if abs(bias) > spread:
            return (f"R^2 < 0: a drag bias of {bias:+.3f} exceeds the spread of true drag "
                    f"(std {spread:.3f}); train longer")
        return (f"R^2 < 0: drag errors (mean |dCd| {np.mean(np.abs(pred - true)):.3f}) exceed "
                f"the spread of true drag (std {spread:.3f})")
    if n < 3:
        return f"R^2 over {n} runs says little: it measures the spread of drag across runs"
    return None


def _drag_axes(ax, cd_t: np.ndarray, cd_p: np.ndarray, names: list[str], r2: float) -> None:
    """Predicted against true drag, each point labelled with its run; both axes the same
    range, from 0 when every value is positive (drag), else from below the lowest value."""
    ax.scatter(cd_t, cd_p, s=30, zorder=3)
    for x, y, name in zip(cd_t, cd_p, names):
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    vals = np.concatenate([cd_t, cd_p])
    vals = vals[np.isfinite(vals)]
    lo, hi = (float(vals.min()), float(vals.max())) if vals.size else (0.0, 1.0)
    pad = 0.12 * (max(hi - lo, abs(hi), abs(lo)) or 1.0)  # room for the labels
    lo = 0.0 if lo >= 0 else lo - pad
    hi = hi + pad if hi > 0 else 0.0
    ax.plot([lo, hi], [lo, hi], "k--", linewidth=1, label="predicted = true")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal", adjustable="box")
    ax.set_xlabel("true $C_d$")
    ax.set_ylabel("predicted $C_d$")
    ax.set_title(f"drag over {len(cd_t)} run(s): R$^2$ = "
                 + ("n/a" if math.isnan(r2) else f"{r2:.3g}"))
    ax.legend(loc="upper left", fontsize=8)


def evaluate_png(rows: list[dict], png: Path) -> Path:
    """Left: predicted against true drag across runs, every point named by its run (R^2 in
    the title, and under the figure a line on what it can say when it is negative or there
    are few runs); right: the relative L2 error of each field across runs."""
    import matplotlib.pyplot as plt

    fig = evaluate_figure(rows)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    plt.close(fig)
    return png


def evaluate_figure(rows: list[dict]):
    """The matplotlib figure of :func:`evaluate_png`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4.6), dpi=120)
    cd_t = np.array([r["cd_true"] for r in rows], dtype=float)
    cd_p = np.array([r["cd_pred"] for r in rows], dtype=float)
    r2 = r_squared(cd_p, cd_t)
    _drag_axes(ax, cd_t, cd_p, [str(r.get("run", i)) for i, r in enumerate(rows)], r2)
    names = sorted({k for r in rows for k in r["rel_l2"]})
    vals = [[r["rel_l2"][n] for r in rows if n in r["rel_l2"]] for n in names]
    bx.boxplot(vals, showmeans=True)
    bx.set_xticks(range(1, len(names) + 1), names, rotation=15, fontsize=8)
    bx.set_ylim(bottom=0)
    bx.set_ylabel("relative L2 error")
    bx.set_title("error per field across runs")
    caveat = r2_caveat(cd_p, cd_t)
    fig.tight_layout(rect=(0, 0.06 if caveat else 0, 1, 1))
    if caveat:
        fig.text(0.5, 0.015, caveat, ha="center", va="bottom", fontsize=9, color="firebrick")
    return fig
