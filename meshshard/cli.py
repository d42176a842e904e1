"""The ``meshshard`` command: ``partition``, ``inspect``, ``preprocess``, ``demo``.

Each subcommand is a module in :mod:`meshshard.commands` with ``add_args(parser)`` and
``run(args) -> int``; they are imported only when chosen, so ``meshshard --help`` is fast.

Errors reach the user as one line, ``meshshard COMMAND: error: ...``: exit code 2 for a user
error (bad option, path, permission, file format), 1 for anything unexpected, 130 on Ctrl-C.
``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import traceback
from collections.abc import Sequence

_COMMANDS = {
    "partition": "cut a mesh or point cloud into shards and write the Partition",
    "inspect": "report partition quality like gpmetis (--json, --png)",
    "preprocess": "DrivaerML runs -> partition-aware sharded zarr stores",
    "demo": "the main job on built-in data: generate, preprocess, inspect, train domain-parallel",
}

#: exit codes
EXIT_USER_ERROR = 2
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130


class CLIError(Exception):
    """A user error: printed as one line, exit code 2."""


def _add_global_flags(parser: argparse.ArgumentParser, *, default: object) -> None:
    """``-v`` and ``--debug``, accepted before and after the subcommand."""
    parser.add_argument(
        "-v", "--verbose", action="store_true", default=default, help="log at INFO level"
    )
    parser.add_argument(
        "--debug", action="store_true", default=default,
        help="show the full traceback of an error (and log at DEBUG level)",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshshard",
        description="Domain parallelism for irregular scientific data: partition, inspect, "
        "preprocess DrivaerML runs, and the demo.",
    )
    _add_global_flags(parser, default=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, help_text in _COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # SUPPRESS: a flag given before the subcommand is not reset by the subparser's default
        _add_global_flags(p, default=argparse.SUPPRESS)
        mod = importlib.import_module(f"meshshard.commands.{name}")
        mod.add_args(p)
        p.set_defaults(_module=mod)
    return parser


#: exceptions that mean "the input or the options are wrong": no traceback, exit 2 (meshshard's
#: own errors about data, e.g. ``StoreError`` and ``LayoutError``, are ValueErrors)
USER_ERRORS: tuple[type[BaseException], ...] = (CLIError, ValueError, TypeError, OSError)


def describe_error(exc: BaseException) -> str:
    """One line for ``exc``: OS errors as ``PATH: reason``, others as their message."""
    if isinstance(exc, OSError) and exc.strerror:
        where = exc.filename if exc.filename is not None else ""
        text = f"{where}: {exc.strerror}" if where else exc.strerror
        if isinstance(exc, PermissionError):
            text += " (choose a location you can write to, or fix its permissions)"
        return text
    if isinstance(exc, MemoryError):
        return "out of memory; try fewer cells/points or a machine with more memory"
    return str(exc).strip() or type(exc).__name__


def interrupted(command: str | None) -> int:
    """Ctrl-C: one line on stderr, exit code 130 (128 + SIGINT)."""
    print(
        f"meshshard {command}: interrupted" if command else "meshshard: interrupted",
        file=sys.stderr,
    )
    return EXIT_INTERRUPTED


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = bool(getattr(args, "debug", False))
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args._module.run(args) or 0)
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        return interrupted(args.command)
    except Exception as exc:
        if debug:
            traceback.print_exc()
        user = isinstance(exc, USER_ERRORS)
        line = describe_error(exc)
        if not user:
            line = f"{type(exc).__name__}: {line}"
            if not debug:
                line += " (rerun with --debug for the traceback)"
        print(f"meshshard {args.command}: error: {line}", file=sys.stderr)
        return EXIT_USER_ERROR if user else EXIT_FAILURE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
