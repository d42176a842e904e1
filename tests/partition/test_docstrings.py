from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "api",
    "sfc",
    "rcb",
    "graph",
    "graphpart",
    "quality",
    "halo",
    "cutcount",
    "render",
    "volrefine",
    "weld",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    mod = importlib.import_module(f"meshshard.partition.{name}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0


@pytest.mark.parametrize("name", ["io.cells", "io.cellsizes", "apps.train"])
def test_docstring_examples_of_the_cell_topology_run(name):
    mod = importlib.import_module(f"meshshard.{name}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0
