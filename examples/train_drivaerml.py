"""Train the reference Transolver on preprocessed DrivaerML stores: ``meshshard train`` as a script.

The same options and behaviour as the command (``meshshard train --help``); the app is
:func:`meshshard.apps.train_runs.train_main`. Under torchrun each rank holds its shard of
every sample:

    meshshard preprocess drivaerml RAW STORES --parts 4 --surface
    torchrun --standalone --nproc-per-node 2 examples/train_drivaerml.py STORES \
        --steps 200 --checkpoint ckpt/transolver
    torchrun --standalone --nproc-per-node 4 examples/train_drivaerml.py STORES \
        --data-parallel 2 --data-parallel-mode fsdp --resume --checkpoint ckpt/transolver
    meshshard predict ckpt/transolver-model RAW/run_1 --out predictions

``--part volume`` trains on the volume cells, ``--model domino`` trains DoMINO. Without
torchrun it runs as one process (world size 1).
"""

from __future__ import annotations

import sys

from meshshard.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
