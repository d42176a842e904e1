#!/bin/bash
# Regenerate the small real OpenFOAM case whose exported VTK and force coefficients live next to
# this script. It is never run by `make test`; the committed files are its output (OUT=dir to
# write them elsewhere).
#
#   sudo apt-get install openfoam openfoam-examples     # Debian/Ubuntu, OpenFOAM v1912
#   bash tests/data/openfoam/make_case.sh [WORKDIR]      # ~1.5 min on one core (2-core machine)
#
# The case is the motorBike tutorial (incompressible simpleFoam, k-omega SST) with the mesh
# coarsened from 353k to a few tens of thousands of cells: snappyHexMesh surface level (3 4)
# instead of (5 6), refinement box level 3 instead of 4, one layer kept (so the mesh still has
# prisms and VTK polyhedra). It runs serially (one core, niced). The solver's own `forces` and
# `forceCoeffs` function objects give pressure and viscous forces and Cd/Cl; a `wallShearStress`
# function object writes the shear at the same iteration as the last force sample.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="${1:-/tmp/meshshard-openfoam-case}"
tut=/usr/share/doc/openfoam-examples/examples/incompressible/simpleFoam/motorBike
geo=/usr/share/doc/openfoam-examples/examples/resources/geometry/motorBike.obj.gz
iters="${ITERS:-300}"
export WM_PROJECT_DIR="${WM_PROJECT_DIR:-/usr/share/openfoam}"
for tool in blockMesh snappyHexMesh surfaceFeatureExtract simpleFoam foamToVTK potentialFoam; do
    command -v "$tool" >/dev/null || { echo "make_case.sh: $tool not found; install Debian's openfoam and openfoam-examples" >&2; exit 2; }
done
[ -d "$tut" ] || { echo "make_case.sh: $tut not found; install openfoam-examples" >&2; exit 2; }

start=$(date +%s)
rm -rf "$work"; mkdir -p "$work"; cp -r "$tut"/. "$work"/; cd "$work"
chmod -R u+w .
cp "$geo" constant/triSurface/
zcat system/snappyHexMeshDict.gz > system/snappyHexMeshDict && rm system/snappyHexMeshDict.gz
# coarsen: surface and feature levels, refinement box, fewer cells between levels
sed -i -e 's/level (5 6);/level (3 4);/' -e 's/level 6;/level 4;/' \
       -e 's/levels ((1E15 4));/levels ((1E15 3));/' -e 's/nCellsBetweenLevels 3;/nCellsBetweenLevels 2;/' \
       system/snappyHexMeshDict
grep -q 'level (3 4);' system/snappyHexMeshDict || { echo "make_case.sh: coarsening edit did not apply" >&2; exit 1; }

# controlDict: serial, iterations, full-precision binary fields, and only the function objects we need
cat > system/controlDict <<CD
FoamFile { version 2.0; format ascii; class dictionary; object controlDict; }
application     simpleFoam;
startFrom       startTime;
startTime       0;
stopAt          endTime;
endTime         $iters;
deltaT          1;
writeControl    timeStep;
writeInterval   $iters;
purgeWrite      0;
writeFormat     binary;
writePrecision  17;
writeCompression off;
timeFormat      general;
timePrecision   6;
runTimeModifiable false;
functions
{
    forces1
    {
        type            forces;
        libs            (forces);
        writeControl    timeStep;
        writeInterval   1;
        log             no;
        patches         (motorBikeGroup);
        rho             rhoInf;
        rhoInf          1;
        CofR            (0.72 0 0);
        pitchAxis       (0 1 0);
    }
    forceCoeffs1
    {
        type            forceCoeffs;
        libs            (forces);
        writeControl    timeStep;
        writeInterval   1;
        log             yes;
        patches         (motorBikeGroup);
        rho             rhoInf;
        rhoInf          1;
        liftDir         (0 0 1);
        dragDir         (1 0 0);
        CofR            (0.72 0 0);
        pitchAxis       (0 1 0);
        magUInf         20;
        lRef            1.42;
        Aref            0.75;
    }
    wallShearStress1
    {
        type            wallShearStress;
        libs            (fieldFunctionObjects);
        writeControl    writeTime;
        patches         (motorBikeGroup);
        log             no;
    }
}
CD

run() { echo "== $*"; nice -n 10 "$@" > "log.$1" 2>&1 || { echo "make_case.sh: $1 failed, see $work/log.$1" >&2; tail -20 "log.$1" >&2; exit 1; }; }
run surfaceFeatureExtract
run blockMesh
run snappyHexMesh -overwrite
rm -rf 0 && cp -r 0.orig 0
run checkMesh
run potentialFoam -writephi
run simpleFoam
# -patches takes an OpenFOAM word-regex list: the quotes *and* the parentheses are needed,
# `-patches 'motorBike.*'` silently writes no boundary file.
run foamToVTK -latestTime -one-boundary -patches '("motorBike.*")' -fields '(p U nut wallShearStress)'

# export: a meshshard run directory (the solver's names: p, wallShearStress, U, nut) and the
# solver's own forces and coefficients
out="${OUT:-$here}"
mkdir -p "$out/run_1"
cp VTK/*_"$iters"/boundary.vtp "$out/run_1/boundary_1.vtp"
xz -9 -T1 -c VTK/*_"$iters"/internal.vtu > "$out/run_1/volume_1.vtu.xz"
printf 'aRef,lRef\n0.75,1.42\n' > "$out/run_1/geo_ref_1.csv"
python3 - "$iters" "$out/solver_forces.json" <<'PY'
import json, re, sys
iters, dst = int(sys.argv[1]), sys.argv[2]
log = open("log.simpleFoam").read()
block = log.rsplit("forceCoeffs forceCoeffs1 execute:", 1)[1].split("Cd(f)")[0]
num = r"([-+0-9.eE]+)"
coeffs = {}
for name in ("Cd", "Cs", "Cl", "CmRoll", "CmPitch", "CmYaw"):
    m = re.search(rf"\b{name}\s*:\s*{num}\s*\(pressure:\s*{num}\s*viscous:\s*{num}\)", block)
    coeffs[name] = {"total": float(m[1]), "pressure": float(m[2]), "viscous": float(m[3])}

def last_row(path):
    rows = [ln for ln in open(path) if ln.strip() and not ln.startswith("#")]
    t, *vecs = re.split(r"\s*\(|\)\s*", rows[-1].strip())
    vecs = [[float(x) for x in v.split()] for v in vecs if v.strip()]
    assert int(float(t)) == iters, (path, t)
    return dict(zip(("total", "pressure", "viscous"), vecs))

cells = {}
for ln in open("log.checkMesh"):
    m = re.match(r"\s+(cells|faces|points|hexahedra|prisms|wedges|tet wedges|polyhedra):\s+(\d+)", ln)
    if m and m[1] not in cells:
        cells[m[1]] = int(m[2])
out = {
    "solver": "OpenFOAM v1912 (Debian openfoam 1912.200626) simpleFoam, k-omega SST",
    "case": "motorBike tutorial coarsened by tests/data/openfoam/make_case.sh",
    "iteration": iters,
    "patches": "motorBikeGroup",
    "pressure": "kinematic p/rho (incompressible); the solver multiplies by rhoInf",
    "rho": "rhoInf", "rhoInf": 1.0, "magUInf": 20.0, "Aref": 0.75, "lRef": 1.42,
    "CofR": [0.72, 0.0, 0.0], "dragDir": [1.0, 0.0, 0.0], "liftDir": [0.0, 0.0, 1.0],
    "sideDir": [0.0, 1.0, 0.0], "pitchAxis": [0.0, 1.0, 0.0],
    "conventions": {
        "normals": "boundary face normals point out of the fluid, into the body",
        "wallShearStress": "stress on the fluid: -(Sf/|Sf|) . devReff",
        "force_on_body": "sum(p Sf) - sum(|Sf| wallShearStress), times rhoInf",
        "coefficient": "C = F . dir / (0.5 rhoInf magUInf^2 Aref)",
    },
    "force": last_row("postProcessing/forces1/0/force.dat"),
    "moment": last_row("postProcessing/forces1/0/moment.dat"),
    "coefficients": coeffs,
    "mesh": cells,
    "files": {"surface": "run_1/boundary_1.vtp (foamToVTK -one-boundary: each patch keeps "
                         "its own copy of shared points)",
              "volume": "run_1/volume_1.vtu.xz (foamToVTK internal mesh, VTK polyhedra)",
              "reference": "run_1/geo_ref_1.csv (aRef, lRef as DrivaerML's geo_ref files)"},
}
json.dump(out, open(dst, "w"), indent=1)
PY
echo "case built in $(( $(date +%s) - start )) s in $work; exported to $out"
