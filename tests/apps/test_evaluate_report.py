"""What ``meshshard evaluate`` shows people: a table that fits a terminal, a drag plot whose
points are named and whose axes start at 0, and a word on R^2 where it cannot say much."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pytest

from meshshard.apps.evaluate import format_table
from meshshard.apps.figures import evaluate_figure, r2_caveat, r_squared

FIELDS = ["pMeanTrim", "wallShearStressMeanTrim", "volume:UMeanTrim", "volume:pMeanTrim",
          "volume:nutMeanTrim"]


def _rows(cd_true, cd_pred, fields=FIELDS, volume=True):
    rows = []
    for i, (t, p) in enumerate(zip(cd_true, cd_pred), 1):
        r = {"run": f"run_{100 + i}", "cells": 8_812_345, "rel_l2": {f: 0.1234 for f in fields},
             "cd_true": t, "cd_pred": p, "cl_true": -0.05 * i, "cl_pred": -0.04 * i}
        if volume:
            r["volume_cells"] = 151_234_567
        rows.append(r)
    return rows


def _result(rows):
    cd_t = [r["cd_true"] for r in rows]
    cd_p = [r["cd_pred"] for r in rows]
    fields = sorted({k for r in rows for k in r["rel_l2"]})
    return {"model": "model/", "runs": rows, "files": {}, "summary": {
        "r2_cd": r_squared(cd_p, cd_t), "r2_cl": r_squared(cd_p, cd_t),
        "mean_abs_dcd": float(np.mean(np.abs(np.subtract(cd_p, cd_t)))),
        "mean_rel_l2": {f: 0.1234 for f in fields}}}


@pytest.mark.parametrize("cd_pred", [[0.31, 0.28, 0.35], [0.51, 0.45, 0.55], [0.1, 0.4, 0.2]])
def test_table_fits_100_columns_with_surface_and_volume_fields(cd_pred):
    text = format_table(_result(_rows([0.3, 0.25, 0.33], cd_pred)))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100, "\n" + text
    head = lines[1].split()
    assert head[:3] == ["run", "cells", "vol"] and "wss" in head
    assert "vol U = volume:UMeanTrim" in text and "wss = wallShearStressMeanTrim" in text
    assert all(f"run_10{i}" in text for i in (1, 2, 3))


def test_negative_r2_is_explained_in_one_line():
    # the same bias on every car: R^2 < 0 however well the differences are predicted
    t, p = [0.41, 0.27], [0.58, 0.45]
    assert r_squared(p, t) < 0
    text = format_table(_result(_rows(t, p, volume=False)))
    last = text.splitlines()[-1]
    assert last.startswith("(R^2 < 0: a drag bias of +0.175 exceeds") and "train longer" in last
    # scattered errors larger than the spread
    t, p = [0.30, 0.31, 0.32], [0.35, 0.25, 0.35]
    assert "drag errors (mean |dCd| 0.047) exceed" in r2_caveat(p, t)
    assert "says little" in r2_caveat([0.3, 0.4], [0.31, 0.42])  # R^2 > 0 on 2 runs
    assert "undefined" in r2_caveat([0.3], [0.31])
    assert r2_caveat([0.3, 0.4, 0.5], [0.31, 0.42, 0.48]) is None


def test_drag_plot_names_its_points_starts_at_zero_and_carries_the_caveat():
    fig = evaluate_figure(_rows([0.3, 0.25, 0.33], [0.31, 0.27, 0.34], volume=False))
    ax = fig.axes[0]
    assert sorted(t.get_text() for t in ax.texts) == ["run_101", "run_102", "run_103"]
    assert ax.get_xlim()[0] == 0 and ax.get_ylim()[0] == 0
    assert ax.get_xlim() == ax.get_ylim() and ax.get_xlim()[1] > 0.34
    r2 = r_squared([0.31, 0.27, 0.34], [0.3, 0.25, 0.33])
    assert f"R$^2$ = {r2:.3g}" in ax.get_title() and not fig.texts  # R^2 > 0, 3 runs: no caveat
    plt.close(fig)
    fig = evaluate_figure(_rows([0.41, 0.27], [0.58, 0.45], volume=False))
    ax = fig.axes[0]
    r2 = r_squared([0.58, 0.45], [0.41, 0.27])
    assert f"{r2:.3g}" in ax.get_title()
    assert [t.get_text() for t in fig.texts] == [r2_caveat([0.58, 0.45], [0.41, 0.27])]
    plt.close(fig)
    fig = evaluate_figure(_rows([-0.2, 0.1], [-0.1, 0.12], volume=False))  # a thrust
    lo, hi = fig.axes[0].get_xlim()
    assert lo < -0.2 and hi > 0.12 and not math.isclose(lo, 0)
    plt.close(fig)
