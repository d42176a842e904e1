from __future__ import annotations

import os

import pytest

# keep BLAS/OpenMP from oversubscribing the 2 cores when ranks run beside pytest
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def runs_src(tmp_path_factory):
    """Two small generated DrivaerML-like runs (read-only: copy before modifying)."""
    from meshshard.datasets import make_synthetic_run

    root = tmp_path_factory.mktemp("src")
    make_synthetic_run(root, 1, surface_cells=3000, volume_cells=2000, seed=1)
    make_synthetic_run(root, 2, surface_cells=2000, volume_cells=1500, seed=2)
    return root
