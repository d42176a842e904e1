"""The command answers ``--version``, ``--help`` and a usage error without importing torch,
and an interrupt while it starts is one line (the handler is installed before the parser)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: heavy libraries a start-up must not import (any of them costs seconds on a loaded machine;
#: numpy, ~0.1 s, comes with the partition-method registry that --method's choices are read from)
HEAVY = ("torch", "zarr", "pyvista", "vtk", "scipy", "pandas", "matplotlib")

_PROBE = """
import json, sys
from meshshard.cli import main
code = main(sys.argv[1:])
heavy = sorted(m for m in {heavy!r} if m in sys.modules)
print("PROBE " + json.dumps({{"code": code, "heavy": heavy, "modules": len(sys.modules)}}))
"""


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _probe(*argv: str) -> dict:
    """Run the command in a fresh interpreter; what it exited with and what it imported."""
    r = subprocess.run([sys.executable, "-c", _PROBE.format(heavy=HEAVY), *argv],
                       capture_output=True, text=True, timeout=120, env=_env(), cwd=ROOT)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("PROBE ")]
    assert line, r.stdout + r.stderr
    out = json.loads(line[-1][len("PROBE "):])
    out["stdout"], out["stderr"] = r.stdout, r.stderr
    return out


def _commands() -> list[str]:
    from meshshard.cli import _COMMANDS

    return list(_COMMANDS)


@pytest.mark.parametrize("argv", [
    ("--version",),
    ("--help",),
    ("--bogus",),
    ("partition", "--bogus"),
    ("preprocess", "drivaerml"),
])
def test_startup_imports_nothing_heavy(argv):
    out = _probe(*argv)
    assert out["heavy"] == [], (argv, out["heavy"])
    # the interpreter with argparse, numpy and meshshard's light modules: ~300 here; torch
    # alone brings ~1,000 (2,138 measured with every command imported eagerly)
    assert out["modules"] < 500, out["modules"]
    assert out["code"] == (2 if "--bogus" in argv or argv[0] == "preprocess" else 0)


def test_version_prints_the_version_and_imports_no_torch():
    out = _probe("--version")
    assert out["stdout"].startswith("meshshard "), out["stdout"]
    assert "torch" not in out["heavy"]


def test_every_command_module_and_its_help_import_nothing_heavy():
    """Each command's ``add_args`` (and ``--help``) stays light: its handler's imports wait
    for ``run``."""
    for name in _commands():
        out = _probe(name, "--help")
        assert out["code"] == 0, (name, out["stderr"])
        assert out["heavy"] == [], (name, out["heavy"])
        assert f"meshshard {name}" in out["stdout"]


def test_help_lists_every_command():
    out = _probe("--help")
    for name in ("generate", "partition", "inspect", "preprocess", "train", "predict",
                 "evaluate", "demo"):
        assert name in out["stdout"], name


def test_interrupt_while_the_parser_is_built_is_one_line():
    """SIGINT arrives during start-up (here: while the parser is built): one line, 130."""
    code = """
import os, signal, sys
import meshshard.cli as cli
real = cli.build_parser
def slow():
    os.kill(os.getpid(), signal.SIGINT)
    return real()
cli.build_parser = slow
sys.exit(cli.main(["--version"]))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=_env(), cwd=ROOT)
    assert r.returncode == 130, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines == ["meshshard: interrupted by SIGINT, stopped"], r.stderr


def test_a_pip_install_ships_every_command_and_its_handler():
    """pyproject's package list (what ``pip install`` copies) holds the commands, their
    handlers and the training app, so ``meshshard train`` works outside a checkout too."""
    import re

    from setuptools import find_packages

    text = (ROOT / "pyproject.toml").read_text()  # (tomllib is Python 3.11+)
    found = re.search(r"\[tool\.setuptools\.packages\.find\]\s*include = \[([^\]]*)\]", text)
    include = re.findall(r'"([^"]+)"', found.group(1))
    shipped = set(find_packages(where=str(ROOT), include=include))
    assert {"meshshard.commands", "meshshard.commands.handlers", "meshshard.apps"} <= shipped
    assert re.search(r'^meshshard = "meshshard\.cli:main"$', text, re.M)
    for name in _commands():
        assert (ROOT / "meshshard" / "commands" / f"{name}.py").is_file(), name
        assert (ROOT / "meshshard" / "commands" / "handlers" / f"{name}.py").is_file(), name
    assert (ROOT / "meshshard" / "apps" / "train_runs.py").is_file()
