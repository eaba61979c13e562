"""Run the guarantee mutants (see :mod:`tools.mutants`).

Steps, all on scratch copies (``castor/``, ``tests/``, ``examples/`` and ``pyproject.toml`` copied
to a temporary directory; the real tree is never written):

1. **drift check** — every edit's old snippet must occur exactly once in its file of the real tree
   (a snippet that matches zero or several times is reported, and the run fails: code drift is loud);
2. **probe** — a scratch copy's tests must import the copy's ``castor`` (not an installed one);
   **baseline** — the union of the mutants' tests runs once on an unmutated copy and must pass
   (a mutant "killed" by a test that fails anyway proves nothing);
3. **mutants** — for each mutant, a fresh copy gets its edits and runs only its named test node ids
   with ``-x``; the mutant is *killed* when pytest reports a failure (exit code 1), *survives* when
   they pass (exit 0); any other outcome (no tests collected, usage or collection error) is an
   error. Mutants run in ``--workers`` parallel workers (default 2).

Exit status 0 only when there is no drift, the copy is what gets imported, the baseline passes, and
every mutant is killed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python tools/mutants/run.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.mutants.mutants import MUTANTS, Mutant  # noqa: E402 - after the sys.path set-up above, on purpose

ROOT = Path(__file__).resolve().parents[2]
COPIED = ("castor", "tests", "examples", "pyproject.toml")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", "node_modules", "venv", ".venv")
PER_MUTANT_TIMEOUT_S = 300


@dataclass
class Outcome:
    mutant: Mutant
    verdict: str  # killed | survived | error
    seconds: float
    detail: str = ""


def drift(mutants: list[Mutant], root: Path = ROOT) -> list[str]:
    """One line per edit whose old snippet does not occur exactly once (or that changes nothing),
    and per mutant whose mutated Python does not compile (a snippet that matched only the tail of
    a more indented line: the mutant would fail to import, which kills no guarantee)."""
    problems = []
    names = [m.name for m in mutants]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"{name}: the name is used more than once")
    for mutant in mutants:
        if not mutant.tests:
            problems.append(f"{mutant.name}: names no tests")
        for edit in mutant.edits:
            path = root / edit.file
            if not path.is_file():
                problems.append(f"{mutant.name}: {edit.file} does not exist")
                continue
            count = path.read_text(encoding="utf-8").count(edit.old)
            if count != 1:
                problems.append(f"{mutant.name}: the old snippet occurs {count} times in {edit.file} (expected once):"
                                f"\n    {edit.old!r}")
            if edit.old == edit.new:
                problems.append(f"{mutant.name}: an edit of {edit.file} changes nothing")
        problems.extend(_uncompilable(mutant, root))
    return problems


def _uncompilable(mutant: Mutant, root: Path) -> list[str]:
    """The mutant's Python files, edited as it edits them, that do not compile."""
    texts: dict[str, str] = {}
    for edit in mutant.edits:
        path = root / edit.file
        if not (edit.file.endswith(".py") and path.is_file()):
            continue
        text = texts.get(edit.file)
        texts[edit.file] = (path.read_text(encoding="utf-8") if text is None else text).replace(edit.old, edit.new, 1)
    out = []
    for file, text in texts.items():
        try:
            compile(text, file, "exec")
        except SyntaxError as exc:
            out.append(f"{mutant.name}: {file} does not compile once mutated (line {exc.lineno}: {exc.msg})")
    return out


def scratch_copy(into: Path) -> Path:
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, into / name, ignore=IGNORED, symlinks=True)
        elif source.is_file():
            shutil.copy2(source, into / name)
    return into


def apply(mutant: Mutant, tree: Path) -> None:
    for edit in mutant.edits:
        path = tree / edit.file
        text = path.read_text(encoding="utf-8")
        assert text.count(edit.old) == 1, f"{mutant.name}: drift in {edit.file}"  # checked before, again here
        path.write_text(text.replace(edit.old, edit.new, 1), encoding="utf-8")


def pytest_in(tree: Path, node_ids: list[str], *, stop_first: bool, timeout_s: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    env.setdefault("CASTOR_SHARED_DIR", str(ROOT.parent / "shared"))
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header", "-o", "addopts=",
            "--strict-markers"]
    if stop_first:
        argv.append("-x")
    try:
        return subprocess.run(argv + node_ids, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return subprocess.CompletedProcess(argv, -1, out + f"\n(no verdict within {timeout_s:.0f}s)", "")


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_mutant(mutant: Mutant) -> Outcome:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"castor-mutant-{mutant.name}-") as tmp:
        tree = scratch_copy(Path(tmp))
        apply(mutant, tree)
        done = pytest_in(tree, list(mutant.tests), stop_first=True, timeout_s=PER_MUTANT_TIMEOUT_S)
    seconds = time.monotonic() - started
    if done.returncode == 1:
        return Outcome(mutant, "killed", seconds, _failed_line(done.stdout))
    if done.returncode == 0:
        return Outcome(mutant, "survived", seconds, _tail(done.stdout, 3))
    return Outcome(mutant, "error", seconds, f"pytest exit {done.returncode}:\n{_tail(done.stdout + done.stderr)}")


def _failed_line(stdout: str) -> str:
    for line in stdout.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" - ")[0]
    return _tail(stdout, 1)


def imports_the_copy() -> str | None:
    """None when a scratch copy's ``castor`` is the one its tests import, else where it came from."""
    with tempfile.TemporaryDirectory(prefix="castor-mutant-probe-") as tmp:
        tree = scratch_copy(Path(tmp))
        env = {**os.environ, "PYTHONPATH": str(tree)}
        done = subprocess.run([sys.executable, "-c", "import castor; print(castor.__file__)"], cwd=tree, env=env,
                              capture_output=True, text=True, timeout=60)
        where = done.stdout.strip()
        return None if where.startswith(str(tree)) else (where or done.stderr.strip())


def baseline(mutants: list[Mutant], workers: int = 1) -> list[subprocess.CompletedProcess]:
    """The backing tests on unmutated copies, split over ``workers`` parallel runs."""
    node_ids = sorted({t for m in mutants for t in m.tests})
    chunks = [node_ids[n::workers] for n in range(workers) if node_ids[n::workers]]

    def run(chunk: list[str]) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory(prefix="castor-mutant-baseline-") as tmp:
            return pytest_in(scratch_copy(Path(tmp)), chunk, stop_first=False, timeout_s=PER_MUTANT_TIMEOUT_S * 2)

    with ThreadPoolExecutor(max_workers=len(chunks)) as pool:
        return list(pool.map(run, chunks))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.mutants", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="run only these mutants (default: all)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--list", action="store_true", help="print the mutant table and exit")
    parser.add_argument("--markdown", action="store_true", help="with --list: as the docs/reliability.md table")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of the backing tests")
    args = parser.parse_args(argv)

    mutants = list(MUTANTS)
    if args.names:
        unknown = sorted(set(args.names) - {m.name for m in mutants})
        if unknown:
            print(f"unknown mutants: {', '.join(unknown)}", file=sys.stderr)
            return 2
        mutants = [m for m in mutants if m.name in args.names]
    if args.list:
        if args.markdown:
            print("| mutant | guarantee it breaks | tests that kill it |\n|---|---|---|")
        for m in mutants:
            if args.markdown:
                tests = "<br>".join(f"`{t}`" for t in m.tests)
                print(f"| `{m.name}` | {m.guarantee} | {tests} |")
            else:
                print(f"{m.name}\t{m.guarantee}\t{' '.join(m.tests)}")
        return 0

    problems = drift(list(MUTANTS))
    if problems:
        print("mutant snippets no longer match the code (update tools/mutants/mutants.py):", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"{len(mutants)} mutants; every snippet matches exactly once", flush=True)

    started = time.monotonic()
    elsewhere = imports_the_copy()
    if elsewhere is not None:
        print(f"a scratch copy's tests import castor from {elsewhere}, not from the copy", file=sys.stderr)
        return 1
    if not args.no_baseline:
        failing = [b for b in baseline(mutants, max(1, args.workers)) if b.returncode != 0]
        for base in failing:
            print(f"the backing tests fail on the unmutated tree (pytest exit {base.returncode}):\n"
                  f"{_tail(base.stdout + base.stderr, 30)}", file=sys.stderr)
        if failing:
            return 1
        print(f"baseline: the backing tests pass on the unmutated tree ({time.monotonic() - started:.0f}s)",
              flush=True)

    outcomes: list[Outcome] = []
    with ThreadPoolExecutor(max_workers=max(1, args.workers)) as pool:
        for outcome in pool.map(run_mutant, mutants):
            outcomes.append(outcome)
            print(f"{outcome.verdict:8} {outcome.mutant.name:44} {outcome.seconds:5.1f}s  {outcome.detail}"
                  if outcome.verdict == "killed" else
                  f"{outcome.verdict.upper():8} {outcome.mutant.name:44} {outcome.seconds:5.1f}s\n{outcome.detail}",
                  flush=True)
    bad = [o for o in outcomes if o.verdict != "killed"]
    total = time.monotonic() - started
    print(f"{len(outcomes) - len(bad)}/{len(outcomes)} mutants killed in {total:.0f}s"
          + (f"; not killed: {', '.join(o.mutant.name for o in bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
