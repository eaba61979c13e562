"""``process_tree.descendants``: a tree's processes read from the tree's own ``/proc`` entries.

A killed Icarus worker's tree (and a utility command's) was found with psutil's recursive
``children``, which reads every process's ``stat`` on the machine: milliseconds on a busy host,
paid between a call's deadline and its ``timeout`` answer. These pin that the walk finds what
psutil finds -- grandchildren, children of a non-main thread -- and reads nothing outside the tree.
"""

from __future__ import annotations

import builtins
import os
import subprocess
import sys
import textwrap

import psutil
import pytest

from castor.adapters import process_tree
from tests.support.waiting import poll_until

pytestmark = pytest.mark.timeout(30)

# A root whose main thread starts a shell with a grandchild, and whose second thread starts a
# child of its own (listed in that thread's ``children`` file, not the main task's).
ROOT = textwrap.dedent("""
    import subprocess, sys, threading
    subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60; wait"])
    t = threading.Thread(target=lambda: subprocess.Popen(["sleep", "61"]).wait())
    t.start()
    sys.stdin.read()
""")


@pytest.fixture
def tree():
    root = subprocess.Popen([sys.executable, "-c", ROOT], stdin=subprocess.PIPE)
    try:
        assert poll_until(lambda: len(psutil.Process(root.pid).children(recursive=True)) == 4, timeout=10), \
            "the tree did not start"
        yield root
    finally:
        for child in psutil.Process(root.pid).children(recursive=True):
            child.kill()
        root.kill()
        root.wait()


def test_descendants_are_what_psutil_finds_grandchildren_and_a_threads_children_included(tree):
    found = process_tree.descendants(tree.pid)
    assert sorted(p.pid for p in found) == sorted(p.pid for p in psutil.Process(tree.pid).children(recursive=True))
    assert all(isinstance(p, psutil.Process) for p in found)
    assert {" ".join(p.cmdline()) for p in found} >= {"sleep 61", "sleep 60"}


def test_descendants_read_only_the_trees_own_proc_entries(tree, monkeypatch):
    mine = {tree.pid, *(p.pid for p in psutil.Process(tree.pid).children(recursive=True))}
    read: list[str] = []
    real_open, real_listdir = builtins.open, os.listdir

    def open_(path, *args, **kwargs):
        read.append(str(path))
        return real_open(path, *args, **kwargs)

    def listdir(path="."):
        read.append(str(path))
        return real_listdir(path)

    monkeypatch.setattr(builtins, "open", open_)
    monkeypatch.setattr(os, "listdir", listdir)
    process_tree.descendants(tree.pid)
    outside = [path for path in read if path.startswith("/proc/")
               and not (path.split("/")[2].isdigit() and int(path.split("/")[2]) in mine)]
    assert not outside, f"read {len(outside)} entries of other processes, e.g. {outside[:3]}"


def test_a_kernel_without_children_files_gets_psutils_scan(tree, monkeypatch):
    real_exists = os.path.exists
    monkeypatch.setattr(os.path, "exists", lambda path: False if str(path).endswith("/children") else real_exists(path))
    assert sorted(p.pid for p in process_tree.descendants(tree.pid)) == \
        sorted(p.pid for p in psutil.Process(tree.pid).children(recursive=True))


def test_a_process_that_is_gone_has_no_descendants():
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert process_tree.descendants(gone.pid) == []
