"""The main job at a small size: the 2-rank loss curve equals the one-process curve."""

import json
from pathlib import Path

import numpy as np

from meshshard.cli import main


def test_demo_small_matches_single_process(tmp_path, capsys, monkeypatch):
    import meshshard.apps.demo as demo

    # the reference stops early (30 of the default 90 steps; here 4 of 6): the ranks go on
    monkeypatch.setattr(demo, "REFERENCE_STEPS", 4)
    out = tmp_path / "demo"
    code = main(["demo", "--out", str(out), "--cells", "3000", "--steps", "6"])
    text = capsys.readouterr().out
    assert code == 0, text
    summary = json.loads((out / "losses.json").read_text())
    one = np.array(summary["losses_1_process"])
    two = np.array(summary["losses_2_ranks"])
    assert one.shape == (4,) and two.shape == (6,)
    np.testing.assert_allclose(two[:4], one, rtol=1e-4)
    assert "over 4 steps" in text
    assert one[-1] < one[0]  # it trains
    for path in summary["files"].values():
        assert Path(path).exists(), path
        assert str(path) in text  # every announced file is printed
    assert "edge cut" in text and "largest relative loss difference" in text
    # it ends with meshshard evaluate's table and PNG, after predicting the unseen run
    last = text.rstrip().splitlines()
    assert last[-1] == f"evaluation PNG: {out / 'evaluate' / 'evaluation.png'}"
    assert any(line.startswith("R^2 drag") for line in last[-8:])
    # two different cars, their morphs printed and recorded; R^2 > 0, or one line on why not
    for i in (1, 2):
        assert f"      run_{i}: length " in text
        assert (out / "raw" / f"run_{i}" / f"geo_parameters_{i}.csv").is_file()
    ev = summary["evaluate"]
    assert ev["r2_cd"] > 0 or last[-2].startswith("(R^2 < 0: "), last[-2]
    table = (out / "evaluate" / "evaluation.txt").read_text()
    assert "run_1" in table and "run_2" in table and "R^2 drag" in table
    assert table.splitlines()[1].strip() in text
    assert (out / "evaluate" / "evaluation.png").stat().st_size > 10_000
    import pyvista as pv

    vtp = pv.read(out / "predict" / "run_2" / "boundary_2.vtp")
    assert "pMeanTrimPred" in vtp.cell_data


def test_demo_refuses_ranks_not_dividing_parts(capsys):
    assert main(["demo", "--parts", "4", "--ranks", "3"]) == 2
    assert "must divide" in capsys.readouterr().err


def test_loss_png_has_a_relative_difference_panel(tmp_path):
    """Issue 26: the two loss curves overlap, so the picture could not show the agreement; a
    second panel plots |a - b| / |b| per step (0 drawn at the floor)."""
    from meshshard.apps.demo import _REL_FLOOR, _loss_figure, _plot

    one = [1.0, 0.5, 0.25, 0.125]
    two = [1.0, 0.5 * (1 + 3e-7), 0.25 * (1 - 1e-6), 0.125]
    fig = _loss_figure({"1 process": one, "2 ranks": two})
    top, rel = fig.axes
    assert [len(line.get_ydata()) for line in top.get_lines()] == [4, 4]
    got = rel.get_lines()[0].get_ydata()
    np.testing.assert_allclose(got, [_REL_FLOOR, 3e-7, 1e-6, _REL_FLOOR], rtol=1e-6)
    assert rel.get_yscale() == "log" and "relative difference" in rel.get_ylabel()
    _plot(tmp_path / "loss.png", {"1 process": one, "2 ranks": two})
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
