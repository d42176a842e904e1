"""The graph package's docstring examples run (no process group needed)."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("name", ["build"])
def test_docstring_examples_run(name):
    mod = importlib.import_module(f"meshshard.graph.{name}")
    result = doctest.testmod(mod)
    assert result.attempted > 0 and result.failed == 0
