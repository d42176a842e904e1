"""A small trained checkpoint on synthetic runs, shared by the apps tests (built once)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def world_of_one():
    from meshshard.comm.process import init

    init()  # the kNN features need a process group; a world of one in pytest's process


@pytest.fixture(scope="session")
def trained(tmp_path_factory, world_of_one) -> dict[str, Path]:
    from meshshard.apps.export import export_surface_model
    from meshshard.apps.train import TrainConfig, load_sample, make_model, train_steps
    from meshshard.datasets import make_synthetic_run
    from meshshard.datasets.curator import write_curator_store
    from meshshard.pipelines import preprocess_runs

    root = tmp_path_factory.mktemp("apps")
    for i, cells in ((1, 1800), (2, 2300), (3, 2000)):
        make_synthetic_run(root / "raw", index=i, surface_cells=cells, volume_cells=0, seed=i)
    preprocess_runs(root / "raw", root / "stores", parts=2, volume=False, progress=False)
    write_curator_store(root / "curator" / "run_2.zarr", root / "raw" / "run_2", volume=False)
    cfg = TrainConfig(steps=5, n_hidden=16, n_layers=2, heads=2, slices=8)
    s = load_sample(root / "stores" / "run_1.zarr", 0, 1, None, knn=cfg.knn,
                    standardise_target=False)
    t = s["target"]
    mu, sd = t.mean(dim=(0, 1)), t.std(dim=(0, 1)) + 1e-12
    s["target"] = (t - mu) / sd
    model = make_model(cfg, s["features"].shape[-1], s["target"].shape[-1])
    train_steps(model, s, cfg)
    ckpt = export_surface_model(
        root / "ckpt", model, model_config=cfg.model_kwargs(7, t.shape[-1]), knn=cfg.knn,
        store=root / "stores" / "run_1.zarr", target_mean=mu.tolist(), target_std=sd.tolist())
    return {"root": root, "ckpt": ckpt, "raw": root / "raw", "stores": root / "stores",
            "curator": root / "curator" / "run_2.zarr"}


@pytest.fixture(scope="session")
def trained_volume(tmp_path_factory, world_of_one) -> dict[str, Path]:
    """A small volume model (Transolver on volume cell centres) trained on synthetic run 1;
    runs 1 and 2 as run directories, 2-part meshshard stores and curator stores."""
    from meshshard.apps.train import TrainConfig, make_model, train_steps
    from meshshard.apps.volume import export_volume_model, load_volume_sample
    from meshshard.datasets import make_synthetic_run
    from meshshard.datasets.curator import write_curator_store
    from meshshard.pipelines import preprocess_runs

    root = tmp_path_factory.mktemp("vol")
    for i, vcells in ((1, 1200), (2, 1500)):
        make_synthetic_run(root / "raw", index=i, surface_cells=600, volume_cells=vcells,
                           seed=i)
        write_curator_store(root / "curator" / f"run_{i}.zarr", root / "raw" / f"run_{i}")
    preprocess_runs(root / "raw", root / "stores", parts=2, progress=False)
    s = load_volume_sample(root / "raw" / "run_1")
    t = s["target"]
    mu, sd = t.mean(dim=(0, 1)), t.std(dim=(0, 1)) + 1e-12
    s["target"] = (t - mu) / sd
    cfg = TrainConfig(steps=5, n_hidden=16, n_layers=2, heads=2, slices=8)
    model = make_model(cfg, s["features"].shape[-1], t.shape[-1])
    train_steps(model, s, cfg)
    ckpt = export_volume_model(
        root / "vckpt", model, model_config=cfg.model_kwargs(s["features"].shape[-1],
                                                             t.shape[-1]),
        rows=s["rows"], target_mean=mu.tolist(), target_std=sd.tolist())
    return {"root": root, "ckpt": ckpt, "raw": root / "raw", "stores": root / "stores",
            "curator": root / "curator"}
