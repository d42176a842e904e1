"""predict's one chunk number is three budgets, each bounding what it is named for: points per
chunk of the model's forward, kNN queries per round of the surface features, volume cells per
round of the signed distances. Small budgets make more chunks of at most that size and the
same results as the unchunked reference; the defaults have one home
(:mod:`meshshard.apps.chunk_budgets`), and the CLI's old flag still sets all three."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np
import pytest

from meshshard.apps.chunk_budgets import (
    DEFAULT_BUDGET,
    DEMO_BUDGET,
    MIN_POINTS_PER_CHUNK,
    ChunkBudgets,
)

ROOT = Path(__file__).resolve().parents[2]


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _model_calls(model) -> list[int]:
    """Points of every call of ``model`` from now on (a forward pre-hook)."""
    seen: list[int] = []
    model.register_forward_pre_hook(lambda _m, args: seen.append(int(args[0].shape[1])))
    return seen


@pytest.fixture
def knn_rounds(monkeypatch) -> list[int]:
    """Queries of every round of :func:`meshshard.ops.knn_chunks` (as the features call it)."""
    from meshshard import ops

    seen: list[int] = []
    real = ops.knn_chunks

    def counted(*args, **kwargs):
        for a, b, *rest in real(*args, **kwargs):
            seen.append(b - a)
            yield (a, b, *rest)

    monkeypatch.setattr(ops, "knn_chunks", counted)
    return seen


@pytest.fixture
def sdf_rounds(monkeypatch) -> list[int]:
    """Cells of every round of the volume's signed distances."""
    from meshshard.ops.sdf import ShardedSurface

    seen: list[int] = []
    real = ShardedSurface.signed_distance

    def counted(self, q, *args, **kwargs):
        seen.append(int(q.shape[0]))
        return real(self, q, *args, **kwargs)

    monkeypatch.setattr(ShardedSurface, "signed_distance", counted)
    return seen


def test_of_fills_the_budgets_not_given_from_the_one_number():
    assert ChunkBudgets.of(4096) == ChunkBudgets(4096, 4096, 4096)
    assert ChunkBudgets.of(4096, 512) == ChunkBudgets(4096, 512, 4096)
    assert ChunkBudgets.of(4096, max_cells_per_round=64) == ChunkBudgets(4096, 4096, 64)
    assert ChunkBudgets.of(None) == ChunkBudgets(None, None, None)  # the unchunked reference
    assert ChunkBudgets.of(None, 512) == ChunkBudgets(None, 512, None)
    assert ChunkBudgets.of() == ChunkBudgets() == ChunkBudgets.of(DEFAULT_BUDGET)
    assert ChunkBudgets.of(300, 500, 200).as_dict() == {
        "max_points_per_chunk": 300, "max_queries_per_chunk": 500, "max_cells_per_round": 200}


def test_surface_budgets_bound_model_chunks_and_knn_rounds(trained, knn_rounds):
    from meshshard.apps.inputs import read_surface_rows
    from meshshard.apps.model_file import load_model
    from meshshard.apps.predict import predict_rows

    mf = load_model(trained["ckpt"])
    rows = read_surface_rows(trained["stores"] / "run_1.zarr")
    n = len(rows.centers)
    calls = _model_calls(mf.model)
    whole = predict_rows(mf, rows, max_points_per_chunk=None)
    assert calls == [n] and knn_rounds == []  # one forward, no streamed kNN
    results = {}
    for points, queries in ((300, 500), (700, None), (300, 128)):
        calls.clear()
        knn_rounds.clear()
        results[points, queries] = predict_rows(mf, rows, max_points_per_chunk=points,
                                                max_queries_per_chunk=queries)
        q = queries or points  # the kNN's budget follows the model's when not given
        assert max(calls) == points and sum(c for c in calls if c) % n == 0, calls
        assert calls[: -(-n // points)] == [min(points, n - a) for a in range(0, n, points)]
        assert knn_rounds == [min(q, n - a) for a in range(0, n, q)], (points, queries)
    for key, got in results.items():  # the same predictions as the unchunked reference
        assert _rel(got, whole) <= 1e-5, key
    # the kNN's budget alone changes nothing: the same neighbours, the same features
    np.testing.assert_array_equal(results[300, 500], results[300, 128])


def test_volume_budgets_bound_model_chunks_and_distance_rounds(trained_volume, sdf_rounds):
    from meshshard.apps.model_file import load_model
    from meshshard.apps.volume import predict_volume_rows
    from meshshard.apps.volume_inputs import read_volume_rows, volume_inputs

    mf = load_model(trained_volume["ckpt"])
    rows = read_volume_rows(trained_volume["raw"] / "run_1")
    m = len(rows.centers)
    whole_inputs = [t.numpy() for t in volume_inputs(rows)]
    assert sdf_rounds == [m]
    calls = _model_calls(mf.model)
    whole = predict_volume_rows(mf, rows, max_points_per_chunk=None)
    assert calls == [m]
    for points, cells in ((400, 97), (300, None)):
        calls.clear()
        sdf_rounds.clear()
        got = predict_volume_rows(mf, rows, max_points_per_chunk=points,
                                  max_cells_per_round=cells)
        c = cells or points
        assert sdf_rounds == [min(c, m - a) for a in range(0, m, c)], (points, cells)
        assert max(calls) == points
        assert calls[: -(-m // points)] == [min(points, m - a) for a in range(0, m, points)]
        assert _rel(got, whole) <= 1e-5, (points, cells)
        sdf_rounds.clear()
        inputs = [t.numpy() for t in volume_inputs(rows, None, c)]
        assert len(sdf_rounds) == -(-m // c)
        for a, b in zip(inputs, whole_inputs):  # distances per cell: bitwise the same
            np.testing.assert_array_equal(a, b)


def _parse(*argv: str):
    from meshshard.cli import build_parser

    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize("command", ["predict", "evaluate", "demo"])
def test_the_old_flag_sets_all_three_and_each_can_be_set_apart(command):
    from meshshard.commands._chunks import budgets_of

    pos = {"predict": ["CKPT", "RUN", "--out", "o"], "evaluate": ["RUN", "--out", "o"],
           "demo": []}[command]
    default = DEMO_BUDGET if command == "demo" else DEFAULT_BUDGET
    assert ChunkBudgets.of(**budgets_of(_parse(command, *pos))) == ChunkBudgets.of(default)
    one = budgets_of(_parse(command, *pos, "--max-points-per-chunk", "4096"))
    assert ChunkBudgets.of(**one) == ChunkBudgets(4096, 4096, 4096)
    apart = budgets_of(_parse(command, *pos, "--max-points-per-chunk", "4096",
                              "--max-queries-per-chunk", "512", "--max-cells-per-round", "64"))
    assert ChunkBudgets.of(**apart) == ChunkBudgets(4096, 512, 64)
    if command == "predict":  # --unchunked: the model whole, and every budget not given
        b = budgets_of(_parse(command, *pos, "--unchunked", "--max-queries-per-chunk", "512"))
        assert ChunkBudgets.of(**b) == ChunkBudgets(None, 512, None)


@pytest.mark.parametrize("flag", ["--max-points-per-chunk", "--max-queries-per-chunk",
                                  "--max-cells-per-round"])
def test_a_budget_below_one_is_refused_in_the_flags_words(flag, tmp_path, capsys):
    from meshshard.cli import main

    assert main(["evaluate", str(tmp_path), "--out", str(tmp_path / "o"), flag, "0"]) == 2
    assert f"{flag} 0 must be >= 1" in capsys.readouterr().err


def test_the_defaults_have_one_home():
    """The default, the demo's and the floor are named once; every signature, parser and
    message takes them from :mod:`meshshard.apps.chunk_budgets`."""
    from meshshard.apps import demo, evaluate, predict, rows, volume
    from meshshard.apps.input_checks import check_points_per_chunk

    for fn in (predict.predict_run, predict.predict_rows, evaluate.evaluate_runs,
               evaluate.evaluate_one, rows.run_model):
        assert inspect.signature(fn).parameters["max_points_per_chunk"].default == DEFAULT_BUDGET
    assert inspect.signature(demo.run_demo).parameters["max_points_per_chunk"].default == \
        DEMO_BUDGET
    for fn in (volume.predict_volume_rows, volume.predict_volume_run, volume.evaluate_volume):
        assert inspect.signature(fn).parameters["max_cells_per_round"].default is None
    for command, default in (("predict", DEFAULT_BUDGET), ("evaluate", DEFAULT_BUDGET),
                             ("demo", DEMO_BUDGET)):
        pos = {"predict": ["C", "R", "--out", "o"], "evaluate": ["R", "--out", "o"]}
        assert _parse(command, *pos.get(command, [])).max_points_per_chunk == default
    with pytest.raises(ValueError, match=f"is below {MIN_POINTS_PER_CHUNK}.*default "
                                         f"{DEFAULT_BUDGET};"):
        check_points_per_chunk(MIN_POINTS_PER_CHUNK - 1)
    # no budget literal elsewhere in the apps and the commands (1 << 16 is also the
    # standardisation's step in features.py, a different number that happens to be equal)
    literal = re.compile(r"1\s*<<\s*1[68]|262[_,]?144|65[_,]?536")
    allowed = {("features.py", "_STEP = 1 << 16")}
    found = []
    for path in sorted((ROOT / "meshshard" / "apps").glob("*.py")) + sorted(
            (ROOT / "meshshard" / "commands").rglob("*.py")):
        if path.name == "chunk_budgets.py":
            continue
        for line in path.read_text().splitlines():
            if literal.search(line) and not any(path.name == f and line.strip().startswith(s)
                                                for f, s in allowed):
                found.append(f"{path.relative_to(ROOT)}: {line.strip()}")
    assert found == []
