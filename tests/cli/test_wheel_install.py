"""An installed wheel, not the source checkout: build castor's wheel from a clean copy of the
tree, install it into a fresh venv, and run ``castor demo`` from an empty directory.

What it proves: the wheel carries every module the commands import (``castor.cli``,
``castor.testing``, ...) and the reference Icarus backend as data under
``<prefix>/share/castor/icarus_reference``, and the demo finds it there with no checkout
around; the wheel holds the ``py.typed`` marker and no tests, caches or toolchains. What it
does not: that pip can resolve castor's dependencies — to stay offline and quick it installs
the wheel with ``--no-deps`` and lends the fresh venv this interpreter's site-packages (as a
plain path, so no editable install of castor is picked up from there).
Building the wheel needs setuptools and wheel: from this venv if it has them (no build
isolation, no network), else pip fetches them into an isolated build environment.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

import castor

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(castor.__file__).resolve().parents[1]
SKIP_DIRS = {".git", "build", "dist", "node_modules", "__pycache__", ".pytest_cache", ".ruff_cache",
             ".grimp_cache", ".hypothesis", ".mypy_cache", ".venv", "venv"}


def _clean_copy(dest: Path) -> Path:
    """The source tree without build leftovers (a stale ``build/lib`` would ship removed modules)."""
    def ignore(_dir: str, names: list[str]) -> set[str]:
        return {n for n in names if n in SKIP_DIRS or n.endswith(".egg-info")}

    shutil.copytree(ROOT, dest, ignore=ignore, symlinks=True)
    return dest


def _build_wheel(source: Path, out: Path) -> Path:
    offline = importlib.util.find_spec("wheel") is not None and importlib.util.find_spec("setuptools") is not None
    cmd = [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q", "-w", str(out)]
    if offline:
        cmd.append("--no-build-isolation")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    wheels = sorted(out.glob("castor-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _fresh_venv(where: Path, wheel: Path) -> Path:
    venv.EnvBuilder(with_pip=False, clear=True).create(where)
    python = where / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # castor's dependencies, lent from this interpreter (after the venv's own site-packages on sys.path).
    lent = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(purelib) / "castor_test_deps.pth").write_text("".join(f"{p}\n" for p in sorted(lent)))
    # Without PYTHONPATH: a checkout on it (PYTHONPATH=. pytest) made pip find castor installed
    # already in the new venv and install nothing.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
                           str(wheel)], capture_output=True, text=True, timeout=120, env=env)
    if done.returncode != 0 and "no such option: --python" in done.stderr:  # an old pip: install with a prefix
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--prefix", str(where),
                               str(wheel)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return python


def test_an_installed_wheel_runs_the_demo_from_an_empty_directory(tmp_path: Path) -> None:
    wheel = _build_wheel(_clean_copy(tmp_path / "src"), tmp_path / "wheels")
    names = zipfile.ZipFile(wheel).namelist()
    # The type marker pyproject declares (PEP 561: a type checker reads an installed package's
    # annotations only when it is there), and nothing the program does not run: no tests, caches
    # or toolchains.
    assert "castor/py.typed" in names, sorted(n for n in names if not n.endswith(".py"))
    stray = [n for n in names if n.split("/")[0] in ("tests", "bench", "tools", "integrations")
             or "__pycache__" in n or "/.cache/" in n or n.endswith(".pyc")]
    assert not stray, stray
    env_dir = tmp_path / "env"
    python = _fresh_venv(env_dir, wheel)
    assert (env_dir / "share" / "castor" / "icarus_reference" / "icarus" / "__init__.py").is_file()
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"

    where = subprocess.run(
        [str(python), "-c", "import castor; from castor.testing.reference_backend import reference_backend; "
                            "print(castor.__file__); print(reference_backend())"],
        cwd=empty, env=env, capture_output=True, text=True, timeout=60)
    assert where.returncode == 0, where.stderr
    module_file, backend = where.stdout.split()
    assert Path(module_file).resolve().is_relative_to(env_dir.resolve()), module_file  # the wheel, not the checkout
    assert Path(backend).resolve() == (env_dir / "share" / "castor" / "icarus_reference" / "icarus").resolve()

    castor_cmd = env_dir / "bin" / "castor"
    assert castor_cmd.is_file()  # the console entry point castor.cli:main
    demo = subprocess.run([str(castor_cmd), "demo", "--quiet"], cwd=empty, env=env, capture_output=True,
                          text=True, timeout=180)
    assert demo.returncode == 0, demo.stdout[-4000:] + demo.stderr[-4000:]
    assert "all checks passed" in demo.stdout
    assert any(p.name.startswith("castor-demo-") for p in empty.iterdir())
