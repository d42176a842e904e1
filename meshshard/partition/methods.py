"""The one list of partition methods: names, what each needs, and where its code lives.

Every caller that offers a method by name (:func:`~meshshard.partition.partition`,
:class:`~meshshard.pipelines.RunOptions`, ``meshshard partition/inspect/preprocess/demo
--method``) asks this registry, so a method added with :func:`register_method` or through the
``meshshard.partition_methods`` entry-point group works everywhere at once. This module imports
only the standard library: the CLI can list the methods without loading numpy or torch.

A method is ``fn(points, parts, *, weights, targets, allow_empty, **params) -> Partition``.
Graph methods (``graph=True``) also take ``graph=`` (a scipy.sparse adjacency of the rows):
the CLI then builds the mesh dual or kNN graph for them, and preprocessing cuts the surface on
its dual graph when it stores one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ENTRY_POINT_GROUP", "MethodInfo", "list_methods", "method_info", "register_method",
           "resolve_method", "runtime_methods"]

#: entry-point group of installed packages that add partition methods
#: (``[project.entry-points."meshshard.partition_methods"] mine = "pkg.module:function"``)
ENTRY_POINT_GROUP = "meshshard.partition_methods"


@dataclass(frozen=True)
class MethodInfo:
    """One registered method.

    Attributes
    ----------
    name : str
        The name callers pass as ``method``.
    target : str or callable
        ``"module:function"`` (imported on first use) or the function itself.
    graph : bool
        The method partitions a graph (takes ``graph=``).
    extra : str, optional
        The optional dependency group it needs (``pip install -e '.[extra]'``).
    summary : str
        One line for ``--help``.
    origin : {"builtin", "entry point", "runtime"}
        Where it came from (worker processes re-register the runtime ones).
    """

    name: str
    target: str | Callable[..., Any]
    graph: bool = False
    extra: str | None = None
    summary: str = ""
    origin: str = "runtime"


_B = {"origin": "builtin"}
_BUILTIN = (
    MethodInfo("hilbert", "meshshard.partition.sfc:hilbert",
               **_B, summary="Hilbert curve of the centres; fast, the default"),
    MethodInfo("morton", "meshshard.partition.sfc:morton", **_B, summary="Z-order curve"),
    MethodInfo("rcb", "meshshard.partition.rcb:rcb",
               **_B, summary="recursive coordinate bisection; compact shards, exact targets"),
    MethodInfo("metis", "meshshard.partition.graphpart:metis", graph=True,
               **_B, summary="METIS on the mesh dual or kNN graph; fewest cut edges"),
    MethodInfo("kaminpar", "meshshard.partition.kaminpar_part:kaminpar", graph=True,
               extra="kaminpar", **_B, summary="KaMinPar on the same graphs"),
    MethodInfo("hypergraph", "meshshard.partition.hypergraph:hypergraph", graph=True,
               extra="hypergraph",
               **_B, summary="Mt-KaHyPar on the refresh hypergraph; fewest ghost rows"),
)
_METHODS: dict[str, MethodInfo] = {m.name: m for m in _BUILTIN}
_LOADED = [False]


def _load_entry_points() -> None:
    """Add the installed packages' methods once (a name already taken is left as it is)."""
    if _LOADED[0]:
        return
    _LOADED[0] = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in _METHODS:
            _METHODS[ep.name] = MethodInfo(ep.name, ep.value, summary=f"from {ep.value}",
                                         origin="entry point")


def register_method(
    name: str,
    fn: Callable[..., Any] | str,
    *,
    graph: bool = False,
    extra: str | None = None,
    summary: str = "",
    override: bool = False,
) -> None:
    """Register ``fn(points, parts, *, weights, targets, allow_empty, **params) -> Partition``
    under ``name`` for every caller that takes a method name.

    Parameters
    ----------
    name : str
        The method's name (``partition(..., method=name)``, ``--method name``).
    fn : callable or str
        The function, or ``"module:function"`` to import on first use. Preprocessing workers
        are separate processes: they receive a function registered here by reference, so it
        must be importable (defined at a module's top level, not a lambda).
    graph : bool
        The method takes ``graph=`` (the CLI builds the dual or kNN graph for it).
    extra, summary : str, optional
        The optional dependency group it needs, and one line for ``--help``.
    override : bool
        Replace a method of the same name.

    Raises
    ------
    ValueError
        ``name`` is empty, or taken and ``override`` is False.
    TypeError
        ``fn`` is neither callable nor a ``"module:function"`` string.
    """
    _load_entry_points()
    if not isinstance(name, str) or not name.strip():
        msg = f"a method name must be a non-empty string, got {name!r}"
        raise ValueError(msg)
    if isinstance(fn, str) and ":" not in fn:
        msg = f"method {name!r}: a string target must be 'module:function', got {fn!r}"
        raise TypeError(msg)
    if not (callable(fn) or isinstance(fn, str)):
        msg = f"method {name!r}: fn must be a callable or 'module:function', got {type(fn)}"
        raise TypeError(msg)
    if name in _METHODS and not override:
        msg = f"method {name!r} is already registered; pass override=True to replace it"
        raise ValueError(msg)
    _METHODS[name] = MethodInfo(name, fn, graph=graph, extra=extra, summary=summary)


def list_methods(*, graph: bool | None = None) -> list[str]:
    """Names accepted as ``method`` (only the graph methods with ``graph=True``, only the
    others with ``graph=False``)."""
    _load_entry_points()
    return sorted(n for n, m in _METHODS.items() if graph is None or m.graph == graph)


def method_info(method: str) -> MethodInfo:
    """The registry's record of ``method``.

    Raises
    ------
    ValueError
        An unknown name (the message lists the known ones).
    """
    _load_entry_points()
    if not isinstance(method, str) or method not in _METHODS:
        msg = f"unknown method {method!r}; choose one of {', '.join(list_methods())}"
        raise ValueError(msg)
    return _METHODS[method]


def resolve_method(method: str) -> Callable[..., Any]:
    """The function of ``method``, imported on first use.

    Raises
    ------
    ValueError
        An unknown name.
    ImportError
        Its module cannot be imported (for an extra: which one to install).
    """
    info = method_info(method)
    target = info.target
    if isinstance(target, str):
        mod, _, attr = target.partition(":")
        target = getattr(importlib.import_module(mod), attr)
    return target


def runtime_methods() -> dict[str, MethodInfo]:
    """The methods registered in this process beyond the built-in ones and the entry points
    (what a worker process must register again to know them)."""
    return {n: m for n, m in _METHODS.items() if m.origin == "runtime"}
