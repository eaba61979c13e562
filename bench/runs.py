"""Every benchmark, several full runs in a row, and one table of their ``RESULT`` lines.

    python bench/runs.py [--runs 3] [--only endpoint,worker,...] [--quick] [--keep DIR]

A run is each benchmark of ``BENCHMARKS`` in turn, each in a fresh interpreter (``python
bench/<name>.py``), as a user would start it; nothing else should run on the machine meanwhile.
The table has one row per ``RESULT`` name and one column per run, a line that missed its target
in that run marked ``✗``; a benchmark that failed (a non-zero exit, or no ``RESULT`` line) is
named under the table with the end of its output, and so is a line that one run printed and
another did not (its ``--`` cell: a benchmark that exits 0 but skips a figure does not pass by
omission). Exits 0 only when every line met its target in every run: this is the "every line
meets its target in three full runs in a row" check.

``--keep DIR`` writes each run's whole output to ``DIR/run-<n>.txt`` (the figures behind the
ratios: floors, per-round medians, profiles).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: What a full run is (bench/ray.py and bench/snapshot.py measure what the issue's targets do not name).
BENCHMARKS = ("endpoint", "worker", "casts", "actors", "longrun")
PER_RUN = "its run's (in each cell)"  # a target computed from that run's floor
RESULT = re.compile(r"^RESULT (\S+) (\S+) target(<=|>=)(\S+)\s*$")


@dataclass(frozen=True)
class Line:
    value: str
    op: str
    target: str

    @property
    def met(self) -> bool:
        value, target = float(self.value), float(self.target)
        return value <= target if self.op == "<=" else value >= target


def one_run(names: tuple[str, ...], quick: bool) -> tuple[dict[str, Line], list[str], str]:
    """Each benchmark once: its ``RESULT`` lines by name, the failures, and the whole output."""
    lines: dict[str, Line] = {}
    failures: list[str] = []
    output: list[str] = []
    for name in names:
        argv = [sys.executable, str(HERE / f"{name}.py"), *(["--quick"] if quick else [])]
        started = time.monotonic()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
        text = done.stdout + done.stderr
        output.append(f"== bench/{name}.py ({time.monotonic() - started:.0f} s, exit {done.returncode})\n{text}")
        found = {m.group(1): Line(m.group(2), m.group(3), m.group(4))
                 for m in map(RESULT.match, done.stdout.splitlines()) if m}
        if done.returncode != 0 or not found:
            failures.append(f"bench/{name}.py exited {done.returncode} with {len(found)} RESULT lines:\n"
                            + "\n".join(text.splitlines()[-15:]))
        lines.update(found)
    return lines, failures, "\n".join(output)


def table(runs: list[dict[str, Line]]) -> str:
    names: list[str] = []
    for run in runs:
        names += [name for name in run if name not in names]
    rows = ["| `RESULT` | target | " + " | ".join(f"run {n}" for n in range(1, len(runs) + 1)) + " |",
            "|---|---|" + "---|" * len(runs)]
    for name in names:
        targets = {f"{run[name].op}{run[name].target}" for run in runs if name in run}
        shared = targets.pop() if len(targets) == 1 else None  # else a target taken from its run's floor
        cells = []
        for run in runs:
            line = run.get(name)
            if line is None:
                cells.append("--")
                continue
            own = "" if shared else f" ({line.op}{line.target})"
            cells.append(line.value + own + ("" if line.met else " ✗"))
        rows.append(f"| `{name}` | {shared or PER_RUN} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def missing_lines(runs: list[dict[str, Line]]) -> list[str]:
    """A failure for each run that lacks a ``RESULT`` line another run printed."""
    names = {name for run in runs for name in run}
    return [f"run {n}: no RESULT {name} line (another run printed it)"
            for n, run in enumerate(runs, 1) for name in sorted(names - run.keys())]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", default=",".join(BENCHMARKS), help="comma-separated benchmark names")
    parser.add_argument("--quick", action="store_true", help="each benchmark's --quick (not a target check)")
    parser.add_argument("--keep", help="a directory for each run's whole output")
    args = parser.parse_args()
    names = tuple(n.strip() for n in args.only.split(",") if n.strip())
    if args.runs < 1 or not names:
        parser.error("a check needs at least one run of at least one benchmark")  # else it passes on nothing
    unknown = [n for n in names if not (HERE / f"{n}.py").is_file() or n == "runs"]
    if unknown:
        parser.error(f"no benchmark named {', '.join(unknown)} (bench/*.py)")
    keep = Path(args.keep) if args.keep else None
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Line]] = []
    failures: list[str] = []
    for n in range(1, args.runs + 1):
        print(f"run {n}/{args.runs} ({time.strftime('%H:%M:%S')})", file=sys.stderr, flush=True)
        lines, failed, output = one_run(names, args.quick)
        runs.append(lines)
        failures += [f"run {n}: {f}" for f in failed]
        if keep is not None:
            (keep / f"run-{n}.txt").write_text(output)
    print(table(runs))
    failures += missing_lines(runs)
    for failure in failures:
        print(f"\n{failure}")
    missed = sum(not line.met for run in runs for line in run.values())
    print(f"\n{missed} line(s) missed a target across {args.runs} run(s); {len(failures)} benchmark run(s) failed")
    return 0 if not missed and not failures else 1


if __name__ == "__main__":
    raise SystemExit(main())
