"""The reference UNet3d and ViT run unmodified on sharded grids: output, input gradient, every
parameter gradient and the batch-norm buffers equal one process."""

import pytest
import torch

from meshshard.testing import run_ranks
from tests.shardtensor._grid_model_fns import unet, vit

TOL = {"rtol": 1e-7, "atol": 1e-9}  # float64 models


def _check(report):
    for key in ("out", "x.grad"):
        got, want = report[key]
        torch.testing.assert_close(got, want, **TOL, msg=lambda m, k=key: f"{k}: {m}")
    for group in ("grads", "buffers"):
        for name, (got, want) in report[group].items():
            torch.testing.assert_close(got, want, **TOL, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize(
    ("mesh_shape", "sizes", "norm", "padding_mode"),
    [
        ((2,), ((3, 5),), "group", "zeros"),
        ((2,), ((0, 8),), "batch", "circular"),
        ((2,), ((1, 7),), "instance", "reflect"),
        ((4,), ((2, 0, 5, 1),), "batch", "replicate"),
        ((2, 2), ((3, 5), (1, 7)), "group", "zeros"),
    ],
    ids=["2r_3x5_group", "2r_0x8_batch_circular", "2r_1x7_instance_reflect",
         "4r_2x0x5x1_batch_replicate", "4r_2d_3x5_1x7"],
)
def test_unet_matches_single_process(mesh_shape, sizes, norm, padding_mode):
    n = 1
    for v in mesh_shape:
        n *= v
    for report in run_ranks(unet, n, mesh_shape, sizes, norm, padding_mode, timeout=300):
        _check(report)


@pytest.mark.parametrize("norm", ["batch", "group"])
def test_unet_data_x_domain_mesh(norm):
    """2x2 mesh: batch split over 'data' (1, 1), D split over 'domain' (3, 5); batch-norm
    statistics span both mesh dims, weight gradients are summed over both."""
    for report in run_ranks(unet, 4, (2, 2), ((1, 1), (3, 5)), norm, "zeros", (0, 2),
                            timeout=300):
        _check(report)


@pytest.mark.parametrize("sizes", [(4, 12), (0, 12, 4)], ids=lambda s: "x".join(map(str, s)))
def test_vit_non_attention_path_matches_single_process(sizes):
    """Patch embedding -> tokens sharded on the token dim -> MLPs -> unpatchify."""
    reports = run_ranks(vit, len(sizes), sizes, False, timeout=300)
    for report in reports:
        _check(report)
        placements, tok_sizes = report["token_layout"]
        assert str(placements[0]) == "S(1)"
        assert list(tok_sizes) == [s // 4 * 2 for s in sizes]  # H/4 patch rows x W/4 = 2


@pytest.mark.parametrize("sizes", [(8, 8), (0, 12, 4), (4, 4, 0, 8)],
                         ids=lambda s: "x".join(map(str, s)))
def test_vit_domain_parallel_matches_single_process(sizes):
    """The whole ViT, attention over the sharded tokens by the ring-attention SDPA rule."""
    for report in run_ranks(vit, len(sizes), sizes, True, timeout=300):
        _check(report)
