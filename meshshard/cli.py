"""The ``meshshard`` command: ``partition``, ``inspect``, ``preprocess``, ``demo``.

Each subcommand is a module in :mod:`meshshard.commands` with ``add_args(parser)`` and
``run(args) -> int``; they are imported only when chosen, so ``meshshard --help`` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
from collections.abc import Sequence

_COMMANDS = {
    "partition": "cut a mesh or point cloud into shards and write the Partition",
    "inspect": "report partition quality like gpmetis (--json, --png)",
    "preprocess": "DrivaerML runs -> partition-aware sharded zarr stores",
    "demo": "the main job on built-in data: generate, preprocess, inspect, train domain-parallel",
}


class CLIError(Exception):
    """A user error: printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshshard",
        description="Domain parallelism for irregular scientific data: partition, inspect, "
        "preprocess DrivaerML runs, and the demo.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, help_text in _COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod = importlib.import_module(f"meshshard.commands.{name}")
        mod.add_args(p)
        p.set_defaults(_module=mod)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    saved = _on_interrupt_raise()
    try:
        return int(args._module.run(args) or 0)
    except KeyboardInterrupt as exc:  # SIGINT, or SIGTERM through _on_interrupt_raise
        signum = exc.args[0] if isinstance(exc, Interrupted) else signal.SIGINT
        name = signal.Signals(signum).name
        print(f"meshshard {args.command}: interrupted by {name}, stopped", file=sys.stderr)
        return 128 + signum
    except (CLIError, FileNotFoundError, FileExistsError, ValueError, TypeError) as exc:
        print(f"meshshard {args.command}: error: {exc}", file=sys.stderr)
        return 2
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM (``args[0]``), raised in the main thread so that clean-up runs
    (workers stopped, temporaries removed) before the command exits with 128 + signum."""


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def _on_interrupt_raise() -> dict:
    """Route SIGINT and SIGTERM to :class:`Interrupted`; returns the handlers to restore."""
    import threading

    saved: dict = {}
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGINT, signal.SIGTERM):
            saved[s] = signal.signal(s, _raise_interrupted)
    return saved


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
