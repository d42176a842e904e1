"""The PNG shows every shard: exploded and cut-open views of volumes, a title and sizes."""

from __future__ import annotations

import numpy as np
import pytest
import pyvista as pv

from meshshard.partition import Partition, partition
from meshshard.partition.io import cell_centers
from meshshard.partition.render import render_png, render_views
from tests.partition._pixels import shard_pixels


@pytest.fixture(scope="module")
def cube():
    grid = pv.ImageData(dimensions=(17, 17, 17)).cast_to_unstructured_grid()
    return grid, cell_centers(grid)


def test_every_shard_of_a_volume_is_visible(cube, tmp_path):
    grid, centres = cube
    part = partition(centres, 8, method="hilbert")  # one octant sits behind the centre
    png = render_png(part, tmp_path / "hilbert.png", mesh=grid)
    counts = shard_pixels(png, 8)
    assert (counts > 400).all(), counts.tolist()


def test_interior_shard_is_visible_through_the_cut(cube, tmp_path):
    grid, centres = cube
    r = np.linalg.norm(centres - centres.mean(axis=0), axis=1)
    shells = Partition.from_assignment(np.digitize(r, [2.5, 5.0, 7.5]), 4, method="shells")
    # shard 0 is a ball strictly inside shard 1 inside shard 2 ...: no outside view shows it
    inner = centres[shells.assignment == 0]
    assert inner.size and np.linalg.norm(inner - 8, axis=1).max() < 3
    png = render_png(shells, tmp_path / "shells.png", mesh=grid)
    counts = shard_pixels(png, 4)
    assert (counts > 100).all(), counts.tolist()


def test_surface_two_sides_and_flat_cloud(tmp_path):
    sphere = pv.Sphere(theta_resolution=40, phi_resolution=40)
    part = partition(cell_centers(sphere), 6, method="rcb")
    images, captions = render_views(part, mesh=sphere)
    assert captions == ["front", "back"] and images[0].shape == (640, 640, 3)
    assert (shard_pixels(render_png(part, tmp_path / "s.png", mesh=sphere), 6) > 200).all()
    pts = np.random.default_rng(0).random((2000, 2))
    flat = partition(pts, 5)
    images, captions = render_views(flat, points=pts)
    assert captions == ["from above"] and len(images) == 1


def test_title_names_method_parts_imbalance_and_cut():
    from meshshard.partition.render import _title

    part = Partition.from_assignment(np.array([0, 0, 0, 1]), 2, method="rcb")
    text = _title(part, {"imbalance": 1.5, "edge_cut": 1234, "edge_cut_fraction": 0.1})
    assert text.split("   ·   ") == ["rcb", "P = 2", "imbalance 1.500", "edge cut 1,234 (10.00%)"]
    assert "edge cut skipped (--no-metrics)" in _title(
        part, {"graph_metrics": "skipped (--no-metrics)"}
    )


def test_render_prints_no_x_server_noise(cube, tmp_path, capfd):
    grid, centres = cube
    render_png(partition(centres, 2), tmp_path / "q.png", mesh=grid)
    err = capfd.readouterr().err
    assert "bad X server" not in err and "DISPLAY" not in err, err


def test_surface_from_cell_centres_is_drawn_opaque():
    """Issue 26: a store keeps cell centres, normals and areas, no connectivity; its surface
    was drawn as dots, through which the far side shows. With normals and areas each centre
    becomes a patch: cut a sphere into the half facing the camera (shard 0, blue) and the far
    half (shard 1, orange); the front view then shows (almost) no orange, as the mesh does."""
    from meshshard.partition.render import _side_direction

    sphere = pv.Sphere(theta_resolution=120, phi_resolution=90).compute_normals(
        cell_normals=True, point_normals=False)  # fmt: skip
    sphere = sphere.compute_cell_sizes(length=False, volume=False)
    centres = cell_centers(sphere)
    d = _side_direction(centres)
    part = Partition.from_assignment(((centres - centres.mean(0)) @ d < 0).astype(np.int64), 2)

    def far_side_share(images):
        img = images[0].astype(int)  # the "front" view
        orange = img[..., 0] > img[..., 2] + 60
        blue = img[..., 2] > img[..., 0] + 60
        return orange.sum() / max(1, orange.sum() + blue.sum())

    mesh = far_side_share(render_views(part, mesh=sphere, on="cells", solid=False)[0])
    dots = far_side_share(render_views(part, points=centres, solid=False)[0])
    surf = far_side_share(render_views(part, points=centres, solid=False,
                                       normals=np.asarray(sphere.cell_data["Normals"]),
                                       areas=np.asarray(sphere.cell_data["Area"]))[0])  # fmt: skip
    assert surf <= mesh + 0.01, (surf, mesh, dots)
    assert dots > surf + 0.02, (surf, mesh, dots)  # the dots let the far side through


@pytest.mark.parametrize(("method", "parts"), [("hilbert", 32), ("rcb", 16)])
def test_every_shard_of_a_graded_car_volume_is_visible(method, parts, tmp_path):
    # the DrivaerML-like volume: a dome of cells graded towards the car, whose thin inner
    # shards hug the body. An octant cut left 3 (hilbert, P=32) and 1 (rcb, P=16) of them
    # in neither view; the half cut through the centre, or in front of a hidden shard, shows
    # them all
    from meshshard.datasets.synthetic import make_synthetic_run

    make_synthetic_run(tmp_path, 1, surface_cells=4000, volume_cells=40000, stl_cells=0)
    mesh = pv.read(tmp_path / "run_1" / "volume_1.vtu")
    part = partition(cell_centers(mesh), parts, method=method)
    counts = shard_pixels(render_png(part, tmp_path / "v.png", mesh=mesh), parts)
    assert (counts > 0).all(), counts.tolist()
