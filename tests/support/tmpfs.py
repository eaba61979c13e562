"""A real, small tmpfs for the tests of a full disk (root only: a test that cannot mount is skipped)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def mounted_tmpfs(directory: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``"256k"``) mounted on ``directory`` (made when missing) for the block,
    unmounted after it; the calling test is skipped where this process cannot mount one."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    directory.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], capture_output=True)


def fill_to_the_last_block(directory: Path, chunk: int = 4096) -> None:
    """Write ``directory/filler.bin`` until the file system refuses a byte more (ENOSPC)."""
    with open(directory / "filler.bin", "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
