"""preprocess_runs passes its options to process_run: a misspelt one fails at once, naming
the valid ones, instead of failing every run inside its worker."""

from __future__ import annotations

import pytest

from meshshard.datasets import make_synthetic_run
from meshshard.pipelines import preprocess_runs


def test_a_misspelt_option_is_refused_before_any_run(tmp_path):
    make_synthetic_run(tmp_path / "raw", 1, surface_cells=200, volume_cells=0, seed=1)
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['volumee'\].*'volume'"):
        preprocess_runs(tmp_path / "raw", tmp_path / "out", parts=2, volumee=False)
    assert not (tmp_path / "out").exists()

