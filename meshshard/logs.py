"""Logging set-up shared by the ``meshshard`` command and the processes it starts.

``--debug`` logs meshshard at DEBUG level; a few libraries below it log routine chatter at that
level (numcodecs announces each of its ~28 codecs as it registers it, asyncio its selector),
which would bury meshshard's own lines. :func:`quiet_library_loggers` raises those loggers to
INFO; their warnings and errors still show.
"""

from __future__ import annotations

import logging

__all__ = ["NOISY_LOGGERS", "quiet_library_loggers"]

#: loggers whose DEBUG lines are routine (logged at INFO and above only)
NOISY_LOGGERS = ("numcodecs", "asyncio")


def quiet_library_loggers() -> None:
    """Log :data:`NOISY_LOGGERS` at INFO and above, whatever the root level."""
    for name in NOISY_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level < logging.INFO:
            logger.setLevel(logging.INFO)
