"""castor's docs and code comments stand alone: they never point at files outside the repository.

A successor reads the repository only. So no doc, docstring or comment may cite section numbers
of design documents the reader does not have, or paths into the shared reference folder: every
rule is stated in castor's own words, or points at castor's own doc section
(``docs/materia.md, 'Deliberate differences'``). ``tests/`` is not scanned: tests read fixtures
from the shared folder at test time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: What marks a pointer outside the repository.
FORBIDDEN = ("§", "../shared", "shared/specs", "shared/seeds", "shared/reference", "contracts.md", "anchors.md")


def _scanned_files(root: Path) -> list[Path]:
    files: list[Path] = []
    for top in ("README.md", "CONTRIBUTING.md"):
        if (root / top).is_file():
            files.append(root / top)
    for sub, pattern in (("docs", "*"), ("castor", "*.py"), ("bench", "*")):
        base = root / sub
        if not base.is_dir():
            continue
        for path in sorted(base.rglob(pattern)):
            if path.is_file() and "__pycache__" not in path.parts and "node_modules" not in path.parts:
                files.append(path)
    return files


def _offences(root: Path) -> list[str]:
    found: list[str] = []
    for path in _scanned_files(root):
        raw = path.read_bytes()
        if b"\0" in raw:  # binary (an image, a compiled file): no prose to check
            continue
        text = raw.decode("utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), start=1):
            for needle in FORBIDDEN:
                if needle in line:
                    found.append(f"{path.relative_to(root)}:{lineno}: {needle!r}: {line.strip()[:120]}")
    return found


def test_the_scan_covers_the_docs_the_code_and_the_benchmarks() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in _scanned_files(ROOT)}
    assert "README.md" in names and "CONTRIBUTING.md" in names
    assert "docs/materia.md" in names and "docs/icarus.md" in names
    assert "castor/cli/app.py" in names
    assert any(n.startswith("bench/") for n in names)
    assert not any(n.startswith("tests/") for n in names)


def test_no_doc_or_comment_points_outside_the_repository() -> None:
    offences = _offences(ROOT)
    assert not offences, "pointers outside the repository (state the rule in castor's words):\n" + "\n".join(offences)


@pytest.mark.parametrize("needle", FORBIDDEN)
def test_each_pointer_kind_is_caught(tmp_path: Path, needle: str) -> None:
    (tmp_path / "README.md").write_text("castor\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text("clean line\n")
    (tmp_path / "castor" / "sub").mkdir(parents=True)
    (tmp_path / "castor" / "sub" / "m.py").write_text(f'"""A rule (see {needle} 4.2)."""\n')
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "b.py").write_text("# fine\n")
    offences = _offences(tmp_path)
    assert len(offences) == 1 and offences[0].startswith("castor/sub/m.py:1: ")


def test_tests_and_non_python_files_under_castor_are_not_scanned(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text("FIXTURE = '../shared/specs/x.md'\n")
    (tmp_path / "castor").mkdir()
    (tmp_path / "castor" / "data.json").write_text('{"x": "§"}\n')
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "notes.txt").write_text("see contracts.md\n")
    assert [o.split(":")[0] for o in _offences(tmp_path)] == ["bench/notes.txt"]
