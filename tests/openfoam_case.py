"""The committed real OpenFOAM case (``tests/data/openfoam``, made by its ``make_case.sh``):
where it lives, the solver's own coefficients, and a run directory to work on.

``run_1/boundary_1.vtp`` is foamToVTK's ``-one-boundary`` file of the motorBike patches (OpenFOAM
names: ``p``, ``wallShearStress``, ``U``, ``nut``; kinematic; each patch keeps its own copy of
shared points), ``run_1/volume_1.vtu.xz`` the internal mesh (VTK polyhedra), ``run_1/
geo_ref_1.csv`` the solver's ``Aref``/``lRef``; ``solver_forces.json`` the ``forces`` and
``forceCoeffs`` output at the same iteration (magUInf 20 m/s, rhoInf 1).
"""

from __future__ import annotations

import json
import lzma
import shutil
from pathlib import Path

DATA = Path(__file__).parent / "data" / "openfoam"
RUN = DATA / "run_1"
#: the solver's own record (``coefficients``: Cd, Cl, ... with total / pressure / viscous)
SOLVER = json.loads((DATA / "solver_forces.json").read_text())
U_INF = SOLVER["magUInf"]


def openfoam_run(dst: Path, *, volume: bool = False) -> Path:
    """A copy of the case's run directory under ``dst`` (``dst/run_1``), with the volume
    decompressed to ``volume_1.vtu`` when ``volume``."""
    run = Path(dst) / "run_1"
    run.mkdir(parents=True, exist_ok=True)
    for name in ("boundary_1.vtp", "geo_ref_1.csv"):
        shutil.copy(RUN / name, run / name)
    if volume:
        with lzma.open(RUN / "volume_1.vtu.xz") as src, open(run / "volume_1.vtu", "wb") as out:
            shutil.copyfileobj(src, out)
    return run
