"""The ``meshshard`` subcommands, one module each (``add_args(parser)``, ``run(args) -> int``).

:mod:`meshshard.cli` sits above this room: it imports a command's module only when it is
chosen, and maps meshshard's error family to one line and an exit code. A command never imports
:mod:`meshshard.cli` (that arrow would run upward); the error it raises for a bad option lives
here.
"""

from __future__ import annotations

from meshshard.errors import InputError

__all__ = ["CLIError"]


class CLIError(InputError):
    """A user error found by the command itself: printed as one line, exit code 2."""
