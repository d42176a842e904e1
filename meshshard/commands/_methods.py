"""``--method`` for the commands that partition, from the one registry of methods
(:mod:`meshshard.partition.methods`): a method added through the
``meshshard.partition_methods`` entry-point group is offered by every command at once."""

from __future__ import annotations

import argparse

from meshshard.partition.methods import list_methods, method_info

__all__ = ["add_method_arg", "is_graph_method", "method_help"]


def is_graph_method(method: str) -> bool:
    """Whether ``method`` partitions a graph (the command then builds one for it)."""
    return bool(method) and method in list_methods() and method_info(method).graph


def _described(name: str) -> str:
    info = method_info(name)
    extra = info.extra and f"extra {info.extra}: pip install -e '.[{info.extra}]' from a checkout"
    notes = [n for n in (info.summary, extra) if n]
    return f"{name} ({'; '.join(notes)})" if notes else name


def method_help(default: str | None = "hilbert", *, graph_note: str = "") -> str:
    """One ``--help`` text naming every method with its summary and extra."""
    out = "partitioner: " + ", ".join(_described(n) for n in list_methods())
    if graph_note:
        out += "; " + graph_note
    if default is not None:
        out += f"; default: {default}"
    return out


def add_method_arg(parser: argparse.ArgumentParser, *, default: str | None = "hilbert",
                   graph_note: str = "", suffix: str = "") -> None:
    """``--method/-m`` with the registry's names as choices."""
    parser.add_argument("--method", "-m", choices=list_methods(), default=default,
                        help=method_help(default or "hilbert", graph_note=graph_note) + suffix)
