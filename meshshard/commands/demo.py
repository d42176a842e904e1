"""`meshshard demo` (not implemented yet: see the open issue)."""

from __future__ import annotations

import argparse


def add_args(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    msg = "meshshard demo is not implemented yet"
    raise NotImplementedError(msg)
