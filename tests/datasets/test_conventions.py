"""Conventions read from the data (signed volume) or stated, and field-name maps: a sphere
wound either way is held with normals into the body; an open surface asks to be told; shear
stated on the body is negated; a map onto names the schema lacks is one clear error."""

from __future__ import annotations

import numpy as np
import pytest
import pyvista as pv

from meshshard.datasets.conventions import orientation, signed_volume
from meshshard.datasets.drivaerml import read_surface
from meshshard.datasets.schema import DRIVAERML, FIELD_PRESETS, parse_field_map


def _sphere(path, flip: bool = False, open_: bool = False):
    s = pv.Sphere(radius=1.0, theta_resolution=24, phi_resolution=16).triangulate()
    if open_:
        s = s.extract_cells(np.flatnonzero(s.cell_centers().points[:, 2] > 0)).extract_surface(
            algorithm="dataset_surface")
    if flip:
        s = s.flip_faces() if hasattr(s, "flip_faces") else s.flip_normals()
    n = s.n_cells
    s.cell_data["p"] = np.arange(n, dtype=np.float32)
    s.cell_data["wallShearStress"] = np.tile(np.float32([1.0, 2.0, 3.0]), (n, 1))
    s.save(path)
    return path


def test_signed_volume_is_the_enclosed_volume(tmp_path):
    from meshshard.io.geometry import polygon_geometry

    m = pv.read(_sphere(tmp_path / "s.vtp"))
    faces = m.faces.reshape(-1, 4)[:, 1:]
    c, n, a = polygon_geometry(np.asarray(m.points, np.float64),
                               np.arange(0, faces.size + 1, 3), faces.reshape(-1))
    vol, openness = signed_volume(c, n, a)
    assert abs(vol) == pytest.approx(m.volume, rel=1e-9) and openness < 1e-12


@pytest.mark.parametrize("flip", [False, True])
def test_either_winding_is_held_into_the_body(tmp_path, flip):
    schema = DRIVAERML.with_fields("openfoam")
    s = read_surface(_sphere(tmp_path / "s.vtp", flip=flip), schema=schema)
    radial = np.einsum("ij,ij->i", s.normals.astype(np.float64), s.centers)
    assert (radial < 0).all()  # into the body
    assert s.conventions["normals"] == "into_body"
    assert s.conventions["file_normals"] == ("into_body" if flip else "out_of_body")
    assert s.conventions["from"] == "signed volume"


def test_open_surface_needs_the_orientation_stated(tmp_path):
    path = _sphere(tmp_path / "half.vtp", open_=True)
    schema = DRIVAERML.with_fields("openfoam")
    with pytest.raises(ValueError, match=r"half\.vtp: cannot tell .* --normals into-body"):
        read_surface(path, schema=schema)
    from dataclasses import replace

    s = read_surface(path, schema=replace(schema, normals="out_of_body"))
    assert s.conventions["from"] == "stated"
    radial = np.einsum("ij,ij->i", s.normals.astype(np.float64), s.centers)
    assert (radial < 0).all()


def test_shear_on_the_body_is_negated(tmp_path):
    from dataclasses import replace

    path = _sphere(tmp_path / "s.vtp")
    schema = DRIVAERML.with_fields("openfoam")
    a = read_surface(path, schema=schema)
    b = read_surface(path, schema=replace(schema, shear="on_body"))
    col = slice(*a.columns["wallShearStressMeanTrim"])
    np.testing.assert_array_equal(b.fields[:, col], -a.fields[:, col])
    p = slice(*a.columns["pMeanTrim"])
    np.testing.assert_array_equal(b.fields[:, p], a.fields[:, p])
    assert b.conventions["file_shear"] == "on_body" and b.conventions["shear"] == "on_fluid"


def test_orientation_stated_is_not_second_guessed():
    c = np.zeros((3, 3))
    got = orientation("x", c, np.eye(3), np.ones(3), "into_body")
    assert got["flip"] is False and got["from"] == "stated"


def test_field_maps():
    assert parse_field_map("openfoam") == FIELD_PRESETS["openfoam"]
    assert parse_field_map(" p = pMeanTrim , U=UMeanTrim") == {"p": "pMeanTrim",
                                                                "U": "UMeanTrim"}
    s = DRIVAERML.with_fields({"p": "pMeanTrim"})
    spec = next(f for f in s.surface_fields if f.name == "pMeanTrim")
    assert spec.array == "p" and s.to_json()["field_sources"]["pMeanTrim"] == "p"
    for bad, match in (("p", "FILE=SCHEMA"), ("p=a,p=b", "given twice"), ("", "empty"),
                       ("p=pressure", r"\['pressure'\] are not fields"),
                       ("p=pMeanTrim,q=pMeanTrim", "same schema field")):
        with pytest.raises(ValueError, match=match):
            DRIVAERML.with_fields(bad)
    with pytest.raises(ValueError, match="normals='inward'"):
        from dataclasses import replace

        replace(DRIVAERML, normals="inward")
