"""Capture VTK's own messages so that meshshard can fold them into one error line.

VTK reports a damaged file twice on stderr, once through ``vtkLogger`` (coloured lines) and once
through the ``vtkOutputWindow`` (pyvista forwards that to the ``logging`` root logger), and a
render without an X display warns ``bad X server connection. DISPLAY=`` before falling back to
EGL. :func:`capture_vtk_output` routes both into a buffer for the duration of a block; the
caller adds :meth:`VtkMessages.summary` to the exception it raises.

VTK's output window and logger are process-wide, so blocks in different threads run one at
a time (a re-entrant lock; nesting in one thread is fine).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["VtkMessages", "capture_vtk_output"]

_HEADER = re.compile(r"^(ERROR|Warning|Generic Warning|Debug): In .*, line \d+\s*$")
_LOCK = threading.RLock()
_POINTER = re.compile(r"\s*\(0x[0-9a-fA-F]+\)")


@dataclass
class VtkMessages:
    """What VTK printed inside :func:`capture_vtk_output` (filled when the block ends, and
    readable inside it through :meth:`read`)."""

    text: str = ""
    _window: object = field(default=None, repr=False)
    _logged: list[str] = field(default_factory=list, repr=False)

    def read(self) -> str:
        """Everything captured so far (also valid inside the block)."""
        if self._window is not None:
            self.text = "\n\n".join([str(self._window.GetOutput()), *self._logged])
        return self.text

    def messages(self) -> list[str]:
        """Distinct messages, first line each, without VTK's source-file headers and object
        addresses, in the order they came."""
        out: list[str] = []
        for block in re.split(r"\n\s*\n", self.read()):
            lines = [ln.strip() for ln in block.strip().splitlines() if ln.strip()]
            lines = [ln for ln in lines if not _HEADER.match(ln)]
            if not lines:
                continue
            first = _POINTER.sub("", lines[0])
            if first not in out:
                out.append(first)
        return out

    def summary(self, limit: int = 2, width: int = 240) -> str:
        """The first ``limit`` distinct messages joined by ``"; "``, cut to ``width`` chars
        ("" when VTK said nothing)."""
        msgs = self.messages()
        text = "; ".join(msgs[:limit])
        if len(msgs) > limit:
            text += f"; and {len(msgs) - limit} more"
        return text if len(text) <= width else text[: width - 3] + "..."


@contextmanager
def capture_vtk_output() -> Iterator[VtkMessages]:
    """Route VTK's output window and logger to a buffer inside the block; restore after.

    Errors raised inside the block propagate unchanged; pyvista's ``VtkErrorCatcher`` still
    sees VTK's error events (it observes the output window current when it is entered).

    Examples
    --------
    >>> with capture_vtk_output() as vtk_log:
    ...     pass  # read or render here
    >>> vtk_log.summary()
    ''
    """
    from vtkmodules.vtkCommonCore import vtkLogger, vtkOutputWindow, vtkStringOutputWindow

    with _LOCK:
        window = vtkStringOutputWindow()
        previous = vtkOutputWindow.GetInstance()  # this reference keeps it alive meanwhile
        verbosity = vtkLogger.GetCurrentVerbosityCutoff()
        messages = VtkMessages(_window=window)
        root = logging.getLogger()
        trap = _RootLogTrap(messages._logged)
        root.addFilter(trap)
        vtkOutputWindow.SetInstance(window)
        vtkLogger.SetStderrVerbosity(vtkLogger.VERBOSITY_OFF)
        try:
            yield messages
        finally:
            messages.read()
            messages._window = None
            root.removeFilter(trap)
            vtkLogger.SetStderrVerbosity(verbosity)
            vtkOutputWindow.SetInstance(previous)


class _RootLogTrap(logging.Filter):
    """pyvista's observers of readers send VTK's messages to the *root* logger
    (``logging.error``); keep those instead of printing them."""

    def __init__(self, sink: list[str]) -> None:
        super().__init__()
        self.sink = sink

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "root":
            return True
        self.sink.append(record.getMessage())
        return False
