"""The private inductor cache of a process is its own and is gone once the process exits."""

import os
import subprocess
import sys

from meshshard.testing import run_ranks
from tests.testing import _fns


def test_each_rank_has_its_own_cache_removed_at_exit():
    out = run_ranks(_fns.private_cache_rank, 2)
    paths = [p for p, _, _ in out]
    assert len(set(paths)) == 2
    assert all(env_set and present for _, env_set, present in out)
    assert not any(os.path.exists(p) for p in paths)


def test_plain_process_removes_its_cache_at_exit():
    code = (
        "import os\n"
        "from meshshard.testing.inductor import private_inductor_cache\n"
        "p = private_inductor_cache()\n"
        "open(os.path.join(p, 'f'), 'w').close()\n"
        "print(p)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120)  # fmt: skip
    path = done.stdout.strip()
    assert path and not os.path.exists(path)
