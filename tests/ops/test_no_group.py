"""The neighbour ops on plain tensors with no process group: one message saying to call
``meshshard.comm.init`` (not torch's "Default process group has not been initialized"); after
``init()`` a plain process is a world of one and the same call gives the local answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = """
import json
import torch
from meshshard import ops
from meshshard.comm import init, shutdown
from meshshard.ops.kernels import knn as local_knn

x = torch.rand(60, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
said = {}
calls = {
    "knn": lambda: ops.knn(x, 4),
    "radius": lambda: ops.radius(x, 0.2),
    "knn_graph": lambda: ops.knn_graph(x, 3),
    "radius_graph": lambda: ops.radius_graph(x, 0.2),
    "gather_neighbors": lambda: ops.gather_neighbors(x, torch.zeros(3, 2, dtype=torch.long)),
    "scatter_to_owners": lambda: ops.scatter_to_owners(x[:3], torch.zeros(3, dtype=torch.long),
                                                       sizes=[60]),
}
for name, call in calls.items():
    try:
        call()
        said[name] = None
    except Exception as exc:
        said[name] = [type(exc).__name__, str(exc), isinstance(exc, ValueError)]
init("gloo")
d, i = ops.knn(x, 4)
rd, ri = local_knn(x, x, 4)
same = bool(torch.equal(i, ri) and torch.allclose(d * d, rd))  # the kernel's: squared
shutdown()
print("RESULT " + json.dumps({"said": said, "same": same}))
"""


def test_ops_without_a_process_group_say_to_call_init():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH",
                                                                                  "")]))
    env.pop("RANK", None)
    r = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                       timeout=300, env=env, cwd=ROOT)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, r.stdout + r.stderr
    got = json.loads(line[-1][len("RESULT "):])
    for name, said in got["said"].items():
        assert said is not None, name
        kind, text, is_value_error = said
        assert kind == "InputError" and is_value_error, (name, said)
        assert text.startswith(f"ops.{name} on plain tensors") and "meshshard.comm.init()" in text
        assert "Default process group" not in text
    assert "meshshard.ops.kernels.knn" in got["said"]["knn"][1]
    assert got["same"], "after init() a plain process is a world of one: the local answer"
