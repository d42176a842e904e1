#!/bin/sh
# Regenerates internal.vtu and boundary.vtp: a real OpenFOAM (v1912, Debian's `openfoam` and
# `openfoam-examples` packages) box mesh, blockMesh 6x5x4 hexahedra, one corner refined with
# refineHexMesh so that its unrefined neighbours become split-hex polyhedra (VTK type 42, with
# hanging points), exported by foamToVTK: the volume with its polyhedra in the legacy
# faces/faceoffsets layout, the boundary as one file whose patches each carry their own copy
# of the points they share (as foamToVTK writes them). Takes a few seconds.
#   sh tests/data/foam_refined/make.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
export WM_PROJECT_DIR=/usr/share/openfoam FOAM_ETC=/usr/share/openfoam/etc
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r /usr/share/doc/openfoam-examples/examples/incompressible/icoFoam/cavity/cavity "$work/case"
cd "$work/case"
find . -name '*.gz' -exec gunzip {} +
sed -i 's/(0 0 0.1)/(0 0 0.8)/; s/(1 0 0.1)/(1 0 0.8)/; s/(1 1 0.1)/(1 1 0.8)/;
        s/(0 1 0.1)/(0 1 0.8)/; s/(20 20 1)/(6 5 4)/; s/type empty;/type wall;/' system/blockMeshDict
sed -i 's/empty;/zeroGradient;/' 0/p
perl -0pi -e 's/frontAndBack\s*\{\s*type\s*empty;\s*\}/frontAndBack { type noSlip; }/' 0/U
cat > system/topoSetDict <<'DICT'
FoamFile { version 2.0; format ascii; class dictionary; object topoSetDict; }
actions
(
    { name c0; type cellSet; action new; source boxToCell; box (0 0 0) (0.035 0.041 0.041); }
);
DICT
blockMesh > log.blockMesh 2>&1
topoSet > log.topoSet 2>&1
refineHexMesh -overwrite c0 > log.refine 2>&1
checkMesh > log.checkMesh 2>&1 || { cat log.checkMesh; exit 1; }
foamToVTK -one-boundary -no-point-data > log.foamToVTK 2>&1
cp VTK/case_0/internal.vtu VTK/case_0/boundary.vtp "$here/"
grep -E "internal faces:|cells:|hexahedra:|polyhedra:" log.checkMesh
