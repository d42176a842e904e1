"""The README, followed literally: its shell blocks run line by line in one new shell (at small
sizes: a few flags appended, which argparse lets win), and its quickstart block is the tested
``examples/quickstart.py`` (the same code, every import used)."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

#: flags appended to a README command to make it small here (the last flag wins in argparse)
SMALL = {
    "generate": "--runs 3 --cells 1500",
    "train": "--steps 2 --hidden 8 --layers 1 --slices 4",
    "predict": "--no-png",
}
#: README lines this test does not run, and why
SKIPPED = {
    "make test": "it is this suite",
    "make docs": "its own CI step (mkdocs --strict, with the docs extra)",
}


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README.read_text(), re.S | re.M)


def _shell_lines() -> list[str]:
    """Every command of the README's bash blocks, continuation lines joined, comments cut."""
    out = []
    for block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            cmd = line.split(" #", 1)[0].strip()
            if cmd and not cmd.startswith("#"):
                out.append(cmd)
    return out


def _small(cmd: str, venv: Path, tmp: Path) -> str | None:
    """The command as this test runs it (None: skipped, see :data:`SKIPPED`)."""
    if any(cmd.startswith(k) for k in SKIPPED):
        return None
    if cmd == "make demo":  # the Makefile's own recipe, small, into tmp; the venv is given
        args = f"--cells 1500 --steps 2 --no-png --out {tmp / 'demo_out'}"
        return (f"make -C {shlex.quote(str(ROOT))} VENV={shlex.quote(str(venv))} "
                f"-o {shlex.quote(str(venv / 'bin' / '.installed'))} "
                f"DEMO_ARGS={shlex.quote(args)} demo")
    words = cmd.split()
    if "meshshard" in words:
        sub = words[words.index("meshshard") + 1]
        if sub in SMALL:
            return f"{cmd} {SMALL[sub]}"
    return cmd


@pytest.mark.slow
def test_readme_shell_blocks_run_line_by_line(tmp_path):
    """~40 s of CPU: generate, preprocess, torchrun train and predict (2 ranks), evaluate and
    a small ``make demo``."""
    venv = Path(sys.prefix)
    if not (venv / "bin" / "activate").is_file():
        pytest.skip("not running from a virtual environment")
    lines = _shell_lines()
    # the flow a new user follows: activate, then every command of the pipeline
    assert lines.count("source .venv/bin/activate") >= 1
    for sub in ("generate", "preprocess", "train", "predict", "evaluate"):
        assert any(f"meshshard {sub}" in ln for ln in lines), sub
    (tmp_path / ".venv").symlink_to(venv)  # what `make demo` leaves in a fresh clone
    script = ["set -e"]
    ran = []
    for cmd in lines:
        small = _small(cmd, venv, tmp_path)
        if small is None:
            continue
        ran.append(cmd)
        script += [f"echo {shlex.quote('+ ' + cmd)} >&2", small]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "VIRTUAL_ENV")}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"  # a new shell: the venv is not on it yet
    env["PYTHONPATH"] = str(ROOT)  # this checkout's meshshard (a clone's editable install)
    env["OMP_NUM_THREADS"] = "1"
    r = subprocess.run(["bash", "-c", "\n".join(script)], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=1200)
    started = [ln[2:] for ln in r.stderr.splitlines() if ln.startswith("+ ")]
    assert r.returncode == 0, (f"README line failed: {started[-1] if started else '?'}\n"
                               f"{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    assert started == ran
    assert (tmp_path / "RAW" / "run_3").is_dir()
    assert (tmp_path / "ckpt" / "transolver-model" / "model.json").is_file()
    assert (tmp_path / "pred" / "run_1" / "boundary_1.vtp").is_file()
    assert (tmp_path / "eval" / "evaluation.json").is_file()
    assert (tmp_path / "demo_out" / "losses.json").is_file()


def _code(text: str) -> list[str]:
    """Statements without comments, blank lines or the module docstring."""
    tree = ast.parse(text)
    if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(
            tree.body[0].value, ast.Constant):
        tree.body = tree.body[1:]
    return ast.unparse(tree).splitlines()


def test_readme_quickstart_is_the_example_and_uses_every_import():
    (block,) = [b for b in _blocks("python") if "init_device_mesh" in b]
    example = (ROOT / "examples" / "quickstart.py").read_text()
    assert _code(block) == _code(example)
    tree = ast.parse(block)
    imported = {a.asname or a.name.split(".")[0] for n in ast.walk(tree)
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert imported <= used, f"unused imports in the README quickstart: {imported - used}"
    assert "print(" in block  # it says something
