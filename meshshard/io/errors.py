"""Errors that name the input file a pipeline could not use."""

from __future__ import annotations

from pathlib import Path

from meshshard.errors import InputError

__all__ = ["InputFileError"]


class InputFileError(InputError):
    """An input file (VTK, STL) is damaged, inconsistent or lacks what the schema needs.

    The message starts with the file's path; ``path`` holds it (None when not known yet).
    """

    def __init__(self, msg: str, path: str | Path | None = None) -> None:
        super().__init__(msg)
        self.path = None if path is None else Path(path)
