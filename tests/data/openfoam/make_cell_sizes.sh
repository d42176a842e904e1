#!/bin/bash
# OpenFOAM's own cell volumes and centres of the committed motorBike mesh, for the test of
# meshshard.io.cellsizes (tests/test_openfoam_mesh.py): the mesh steps of make_case.sh (the same
# blockMesh and snappyHexMesh settings, so the same mesh), then `postProcess -func
# writeCellVolumes` and `writeCellCentres`, exported by foamToVTK, and the cells of VTK type 42
# (OpenFOAM's polyhedra, wedges, tet-wedges) plus every 10th other cell written to
# cell_sizes.npz with a hash of the points (the test checks it is the committed mesh).
#
#   bash tests/data/openfoam/make_cell_sizes.sh [WORKDIR]   # ~1 min; needs python3 with pyvista
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="${1:-/tmp/meshshard-openfoam-cells}"
mesh_steps=$(mktemp)
trap 'rm -f "$mesh_steps"' EXIT
sed -n '1,/^run checkMesh/p' "$here/make_case.sh" > "$mesh_steps"
{
    echo 'run postProcess -func writeCellVolumes -time 0'
    echo 'mv log.postProcess log.writeCellVolumes'
    echo 'run postProcess -func writeCellCentres -time 0'
    echo "run foamToVTK -time 0 -no-boundary -no-point-data -fields '(V C)'"
} >> "$mesh_steps"
bash "$mesh_steps" "$work"
"${PYTHON:-python3}" - "$work" "$here/cell_sizes.npz" <<'PY'
import glob, hashlib, sys
import numpy as np
import pyvista as pv
work, dst = sys.argv[1], sys.argv[2]
g = pv.read(glob.glob(f"{work}/VTK/*_0/internal.vtu")[0])
types = np.asarray(g.celltypes)
ids = np.flatnonzero((types == 42) | (np.arange(types.size) % 10 == 0)).astype(np.int32)
points = np.ascontiguousarray(np.asarray(g.points, dtype=np.float32))
np.savez_compressed(dst, ids=ids, V=np.asarray(g.cell_data["V"], np.float32)[ids],
                    C=np.asarray(g.cell_data["C"], np.float32)[ids],
                    points_sha256=np.frombuffer(hashlib.sha256(points.tobytes()).digest(), np.uint8))
print(f"{dst}: {ids.size} cells of {types.size}")
PY
