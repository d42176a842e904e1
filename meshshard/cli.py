"""The ``meshshard`` command: ``generate``, ``partition``, ``inspect``, ``preprocess``, ``train``,
``predict``, ``evaluate``, ``demo``.

Each subcommand has two modules: its options, ``meshshard.commands.NAME`` with
``add_args(parser)`` (the standard library and meshshard's light modules only: no torch, numpy,
zarr or pyvista), and its work, ``meshshard.commands.handlers.NAME`` with ``run(args) -> int``,
imported only when the command runs. So ``meshshard --version``, ``--help`` and a usage error
answer without importing torch (``tests/test_cli_startup.py`` holds every command to it). The
Ctrl-C handler is installed before the parser is built: an interrupt during start-up is one
line too.

Errors reach the user as one line, ``meshshard COMMAND: error: ...``: exit code 2 for a user
error (bad option, path, permission, file format; a bad option too, without argparse's usage
block; any :class:`~meshshard.errors.MeshShardError` but a ``DistributedError``), 1 for the
failure of a valid run (a :class:`~meshshard.errors.DistributedError`: ranks or workers failed
or stalled) and for anything unexpected, 130 on Ctrl-C. ``--debug`` adds the traceback. Output into
a closed pipe (``meshshard inspect ... --json | head -1``) ends quietly with exit code 141, as
a command killed by SIGPIPE does.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
import traceback
from collections.abc import Sequence

from meshshard.commands import CLIError as CLIError  # re-exported: the commands' user error
from meshshard.errors import USER_ERROR_TYPES, is_user_error
from meshshard.logs import quiet_library_loggers

_COMMANDS = {
    "generate": "write synthetic DrivaerML-like runs (varied cars) into a RAW directory",
    "partition": "cut a mesh or point cloud into shards and write the Partition",
    "inspect": "report partition quality like gpmetis (--json, --png)",
    "preprocess": "DrivaerML runs -> partition-aware sharded zarr stores",
    "train": "train the reference Transolver (or DoMINO) on stores, domain-parallel",
    "predict": "a trained model on one run, domain-parallel: fields back in VTK, a PNG",
    "evaluate": "errors and drag/lift of a model (or the truth) over runs: table, JSON, PNG",
    "demo": "the main job on built-in data: generate, preprocess, inspect, train domain-parallel",
}

#: exit codes
EXIT_USER_ERROR = 2
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 128 + 13  # SIGPIPE


def _add_global_flags(parser: argparse.ArgumentParser, *, default: object) -> None:
    """``-v`` and ``--debug``, accepted before and after the subcommand."""
    parser.add_argument(
        "-v", "--verbose", action="store_true", default=default, help="log at INFO level"
    )
    parser.add_argument(
        "--debug", action="store_true", default=default,
        help="show the full traceback of an error (and log at DEBUG level)",
    )  # fmt: skip


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``meshshard partition: error: ... (see --help)``."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("meshshard")
    except PackageNotFoundError:  # a source tree that is not installed
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """``--version``: the installed version, looked up only when asked (reading the package
    metadata costs more than building the whole parser)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show the version and exit")

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        print(f"meshshard {_version()}")  # on stdout, as argparse's own version action
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="meshshard",
        description="Domain parallelism for irregular scientific data: generate DrivaerML-like "
        "runs, partition and inspect meshes, preprocess runs into sharded stores, train, "
        "predict and evaluate domain-parallel, and the demo.",
    )
    parser.add_argument("--version", action=_VersionAction)
    _add_global_flags(parser, default=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, help_text in _COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # SUPPRESS: a flag given before the subcommand is not reset by the subparser's default
        _add_global_flags(p, default=argparse.SUPPRESS)
        importlib.import_module(f"meshshard.commands.{name}").add_args(p)
    return parser


#: exceptions that mean "the input or the options are wrong": no traceback, exit 2 (meshshard's
#: own are :class:`~meshshard.errors.MeshShardError`; the builtins stay for errors raised by the
#: libraries below, e.g. a path that does not exist)
USER_ERRORS: tuple[type[BaseException], ...] = USER_ERROR_TYPES


def exit_code(exc: BaseException) -> int:
    """2 for a user error (:data:`USER_ERRORS`), 1 for a valid run that failed
    (:class:`~meshshard.errors.DistributedError`) or anything unexpected."""
    return EXIT_USER_ERROR if is_user_error(exc) else EXIT_FAILURE


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


def interrupted(command: str | None, signum: int = signal.SIGINT) -> int:
    """SIGINT or SIGTERM: one line on stderr, exit code 128 + signum (130 or 143)."""
    name = signal.Signals(signum).name
    who = f"meshshard {command}" if command else "meshshard"
    print(f"{who}: interrupted by {name}, stopped", file=sys.stderr)
    return 128 + int(signum)


def main(argv: Sequence[str] | None = None) -> int:
    saved = _on_interrupt_raise()  # first: Ctrl-C while the parser is built is one line too
    args = None
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help, --version, or a bad option (one line printed)
            return exc.code if isinstance(exc.code, int) else EXIT_USER_ERROR
        debug = bool(getattr(args, "debug", False))
        logging.basicConfig(
            level=logging.DEBUG if debug else logging.INFO if args.verbose else logging.WARNING,
            format="%(levelname)s %(name)s: %(message)s",
        )
        quiet_library_loggers()  # --debug: meshshard's lines, not every codec registration
        handler = importlib.import_module(f"meshshard.commands.handlers.{args.command}")
        return int(handler.run(args) or 0)
    except BrokenPipeError:  # the reader went away (``| head``): nothing left to tell it
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt as exc:  # SIGINT, or SIGTERM through _on_interrupt_raise
        if debug:
            traceback.print_exc()
        signum = exc.args[0] if isinstance(exc, Interrupted) else signal.SIGINT
        return interrupted(getattr(args, "command", None), signum)
    except Exception as exc:
        if debug:
            traceback.print_exc()
        code = exit_code(exc)
        line = describe_error(exc)
        if not isinstance(exc, USER_ERRORS):  # a bug, or a library's error we did not expect
            line = f"{type(exc).__name__}: {line}"
            if not debug:
                line += " (rerun with --debug for the traceback)"
        who = f"meshshard {args.command}" if args is not None else "meshshard"
        print(f"{who}: error: {line}", file=sys.stderr)
        return code
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush does not fail again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout replaced (tests) or closed
        pass


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
