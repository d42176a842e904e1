"""The main job at a small size: the 2-rank loss curve equals the one-process curve."""

import json
from pathlib import Path

import numpy as np

from meshshard.cli import main


def test_demo_small_matches_single_process(tmp_path, capsys):
    out = tmp_path / "demo"
    code = main(["demo", "--out", str(out), "--cells", "3000", "--steps", "6"])
    text = capsys.readouterr().out
    assert code == 0, text
    summary = json.loads((out / "losses.json").read_text())
    one = np.array(summary["losses_1_process"])
    two = np.array(summary["losses_2_ranks"])
    assert one.shape == two.shape == (6,)
    np.testing.assert_allclose(two, one, rtol=1e-4)
    assert one[-1] < one[0]  # it trains
    for path in summary["files"].values():
        assert Path(path).exists(), path
        assert str(path) in text  # every announced file is printed
    assert "edge cut" in text and "largest relative loss difference" in text
    # it ends with meshshard evaluate's table and PNG, after predicting the unseen run
    last = text.rstrip().splitlines()
    assert last[-1] == f"evaluation PNG: {out / 'evaluate' / 'evaluation.png'}"
    assert last[-3].startswith("R^2 drag")
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
