"""Run under torchrun with 2 ranks: rank 0 blocks in an all-reduce that rank 1 never joins
(rank 1 waits in Python). ``cli``: the CLI's handlers (SIGINT and SIGTERM raise in Python, so
both wait for the main thread) are installed first; ``plain``: Python's defaults. Rank 0
writes its pid to ``OUT/rank0.pid`` just before it blocks."""

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from meshshard.cli import _on_interrupt_raise
from meshshard.comm.process import init

if __name__ == "__main__":
    mode, out = sys.argv[1], Path(sys.argv[2])
    if mode == "cli":
        _on_interrupt_raise()
    rank, world = init()
    if rank == 1:
        while True:
            time.sleep(0.1)
    (out / "rank0.pid").write_text(str(os.getpid()))
    dist.all_reduce(torch.ones(1))  # never returns before the 300 s timeout
    print("the all-reduce returned", flush=True)
