"""meshshard's exception family: one base, a few kinds, each also the builtin users catch.

================  =========================  ==================================================
class             also a                     raised when
================  =========================  ==================================================
MeshShardError    Exception                  (the base: ``except MeshShardError`` catches all)
InputError        ValueError                 an input file, an option or an argument is wrong
LayoutError       ValueError                 a shard layout or a parallel plan does not fit
StoreError        ValueError                 a store or a checkpoint is missing, damaged, stale
DistributedError  RuntimeError               cooperating processes (ranks, workers) failed,
                                             diverged or stalled
================  =========================  ==================================================

Each room's own errors derive from one of these (``InputFileError``, ``CorruptVtkXml``,
``CheckpointError``, ``CollectiveMismatchError``, ...), so code that catches ``ValueError`` or
``RuntimeError`` today keeps working. The ``meshshard`` command prints any of them as one line;
its exit code is 2 for the first four kinds (the input is wrong) and 1 for a
:class:`DistributedError` (a valid run that failed).

This module imports nothing: every floor of the house may use it.
"""

from __future__ import annotations

__all__ = ["DistributedError", "InputError", "LayoutError", "MeshShardError", "NoShardingRuleError",
           "StoreError", "is_user_error"]


class MeshShardError(Exception):
    """The base of every error meshshard raises on purpose."""


class InputError(MeshShardError, ValueError):
    """An input file, an option or an argument is wrong; the message says which and the fix."""


class LayoutError(MeshShardError, ValueError):
    """A shard layout, a placement or a parallel plan does not fit the data or the mesh."""


class NoShardingRuleError(MeshShardError, NotImplementedError):
    """A torch op met a ShardTensor in a layout no sharding rule covers; the message names the
    op and the layout change (``redistribute``) that makes it computable."""


class StoreError(MeshShardError, ValueError):
    """A store or a checkpoint is missing, damaged, of another version, or does not match."""


class DistributedError(MeshShardError, RuntimeError):
    """Cooperating processes (ranks of a process group, worker processes) failed, diverged
    or stalled: the input may be fine, the run was not."""


#: the builtins that also mean "the input or the options are wrong" when a library below
#: meshshard raises them (a path that does not exist, a file it cannot parse)
USER_ERROR_TYPES: tuple[type[BaseException], ...] = (MeshShardError, ValueError, TypeError,
                                                     OSError)


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` says the input or the options are wrong (the ``meshshard`` command's
    exit code 2), not that a valid run failed (a :class:`DistributedError`, a crash, memory).
    """
    return isinstance(exc, USER_ERROR_TYPES) and not isinstance(exc, DistributedError)
