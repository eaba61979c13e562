"""bench/runs.py: several full benchmark runs and one table; exit 0 only when every line met its target."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

RUNS = Path(__file__).resolve().parents[1] / "bench" / "runs.py"


def _module():
    spec = importlib.util.spec_from_file_location("bench_runs", RUNS)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules["bench_runs"] = module  # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(120)
def test_a_real_benchmark_twice_gives_one_row_per_line_and_a_column_per_run(tmp_path):
    done = subprocess.run([sys.executable, str(RUNS), "--only", "actors", "--runs", "2", "--quick",
                           "--keep", str(tmp_path)], capture_output=True, text=True, timeout=110)
    rows = [line for line in done.stdout.splitlines() if line.startswith("| `") and "`RESULT`" not in line]
    assert [row.split("`")[1] for row in rows] == ["ask_hop_ratio", "tell_cost_ratio", "spawn_stop_ratio"]
    assert all(row.count("|") == 5 for row in rows)  # name, target, two runs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-1.txt", "run-2.txt"]
    assert "RESULT ask_hop_ratio" in (tmp_path / "run-1.txt").read_text()
    assert done.returncode == (1 if "✗" in done.stdout else 0)


@pytest.mark.timeout(30)
def test_an_unknown_benchmark_is_refused():
    done = subprocess.run([sys.executable, str(RUNS), "--only", "nope"], capture_output=True, text=True, timeout=25)
    assert done.returncode == 2 and "no benchmark named nope" in done.stderr


@pytest.mark.timeout(30)
@pytest.mark.parametrize("argv", [["--runs", "0"], ["--only", ","]])
def test_a_check_of_nothing_is_refused_not_passed(argv):
    done = subprocess.run([sys.executable, str(RUNS), *argv], capture_output=True, text=True, timeout=25)
    assert done.returncode == 2 and "at least one run of at least one benchmark" in done.stderr


@pytest.mark.timeout(10)
def test_a_missed_line_a_missing_line_and_a_failed_benchmark_fail_the_check(monkeypatch, capsys):
    runs = _module()
    line = runs.Line
    results = iter([
        ({"a_ratio": line("1.10", "<=", "1.25"), "rps": line("12000", ">=", "10000")}, [], ""),
        ({"a_ratio": line("1.30", "<=", "1.25")}, ["bench/x.py exited 1 with 0 RESULT lines:\nboom"], ""),
    ])
    monkeypatch.setattr(runs, "one_run", lambda names, quick: next(results))
    monkeypatch.setattr(sys, "argv", ["runs.py", "--runs", "2"])
    assert runs.main() == 1
    out = capsys.readouterr().out
    assert "| `a_ratio` | <=1.25 | 1.10 | 1.30 ✗ |" in out
    assert "| `rps` | >=10000 | 12000 | -- |" in out
    assert "run 2: bench/x.py exited 1" in out and "1 line(s) missed" in out
    assert "run 2: no RESULT rps line" in out and "2 benchmark run(s) failed" in out


@pytest.mark.timeout(10)
def test_a_line_one_run_skipped_fails_the_check_though_the_benchmark_exited_0(monkeypatch, capsys):
    runs = _module()
    line = runs.Line
    results = iter([({"a": line("1.0", "<=", "1.25"), "b": line("1.0", "<=", "1.25")}, [], ""),
                    ({"a": line("1.0", "<=", "1.25")}, [], "")])
    monkeypatch.setattr(runs, "one_run", lambda names, quick: next(results))
    monkeypatch.setattr(sys, "argv", ["runs.py", "--runs", "2"])
    assert runs.main() == 1
    out = capsys.readouterr().out
    assert "| `b` | <=1.25 | 1.0 | -- |" in out and "run 2: no RESULT b line" in out
    assert "0 line(s) missed a target across 2 run(s); 1 benchmark run(s) failed" in out


@pytest.mark.timeout(10)
def test_every_line_met_in_every_run_passes(monkeypatch, capsys):
    runs = _module()
    monkeypatch.setattr(runs, "one_run", lambda names, quick: ({"a_ratio": runs.Line("1.0", "<=", "1.25")}, [], ""))
    monkeypatch.setattr(sys, "argv", ["runs.py", "--runs", "3"])
    assert runs.main() == 0
    assert "| `a_ratio` | <=1.25 | 1.0 | 1.0 | 1.0 |" in capsys.readouterr().out


@pytest.mark.timeout(10)
def test_a_target_taken_from_each_run_s_floor_is_shown_in_each_cell():
    runs = _module()
    rows = runs.table([{"x_us": runs.Line("40.0", "<=", "45.0")}, {"x_us": runs.Line("40.0", "<=", "35.0")}])
    assert "| `x_us` | its run's (in each cell) | 40.0 (<=45.0) | 40.0 (<=35.0) ✗ |" in rows
