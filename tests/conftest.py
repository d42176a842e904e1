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


def pytest_collection_modifyitems(config, items):
    """``gpu`` tests need CUDA (``@pytest.mark.gpu(devices=2)``: that many devices); without
    them they are skipped with the reason, never run on the CPU in disguise."""
    gpu_items = [it for it in items if it.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for it in gpu_items:
        need = int(it.get_closest_marker("gpu").kwargs.get("devices", 1))
        if have < need:
            it.add_marker(pytest.mark.skip(reason=f"needs {need} CUDA device(s), found {have}"))
