"""`meshshard evaluate RUN... [--checkpoint CKPT] --out OUT`: errors and drag/lift over runs.

The options; the work is :mod:`meshshard.commands.handlers.evaluate`.
"""

from __future__ import annotations

import argparse

from meshshard.commands._inference import add_inference_args


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", help="run directories, meshshard stores or "
                        "physicsnemo-curator stores (or directories of stores)")
    parser.add_argument("--checkpoint", action="append", help="model checkpoint; give it "
                        "twice for a surface and a volume model; without it the truth is "
                        "evaluated against itself (a check of the integration)")
    add_inference_args(parser, out="evaluation.*", png="PNG")


def expand(paths: list[str]) -> list:
    """Directories of stores or run directories become their members (sorted by run number);
    a directory whose name ends in a digit (``stores2/``) is one of them too when it holds
    numbered runs or stores."""
    import re
    from pathlib import Path

    out = []
    for p in map(Path, paths):
        members = []
        if p.is_dir() and not (p / "zarr.json").is_file():
            members = [c for c in p.iterdir()
                       if re.fullmatch(r".*?\d+(\.zarr)?", c.name) and c.is_dir()]
        if members:
            key = [(int(re.findall(r"\d+", c.name)[-1]), c.name) for c in members]
            out += [c for _, c in sorted(zip(key, members))]
        else:
            out.append(p)
    return out

