"""Every model family's training step keeps every tensor on the mesh's device, checked without
a GPU: the step runs on the meta device over torch's fake process group under
:class:`meshshard.testing.device_guard.DeviceGuard`, which raises on the first tensor on another
device (a tensor built on the host is a CPU tensor on a GPU run too). One subprocess runs every
family (each joins its own fake group)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# DoMINO runs its sharded ops in the static-shape mode (search="gathered", backend="brute",
# validate=False) and GhostExchange with validate="never": the default exact forwarded search,
# the deduplicated gather and the collective input check size or decide from the data (host
# syncs), which a meta tensor cannot give
CLEAN = ["transolver", "ring_attention", "grid_unet", "meshgraphnet_plug", "meshgraphnet_ghost",
         "domino", "domino_local"]
# a tensor deliberately left on the host: (family, the meshshard file the guard must name)
HOST = {"meshgraphnet_plug_host_indices": "rules/graph_rows.py",
        "meshgraphnet_ghost_host_rows": "comm/resident.py",
        "domino_host_padding": "ops/_gathered.py"}
_OUT: dict = {}


def _results() -> dict:
    if not _OUT:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), os.environ.get("PYTHONPATH", "")])}
        names = [*CLEAN, *HOST]
        proc = subprocess.run([sys.executable, "-m", "tests.testing._meta_steps", *names],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        _OUT.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    return _OUT


@pytest.mark.parametrize("family", CLEAN)
def test_step_makes_no_tensor_off_the_device(family):
    err = _results()[family]
    assert err is None, f"{family}:\n{err}"


@pytest.mark.parametrize("family", sorted(HOST))
def test_guard_catches_a_host_tensor(family):
    """A step with one tensor left on the host fails, naming the op and the line."""
    err = _results()[family]
    assert err is not None and "WrongDeviceError" in err and "not meta" in err, err
    assert HOST[family] in err, err
