"""docs/architecture.md's tree and docs/supervision.md's limits agree with castor/tree.py.

The worst-case restart products are computed here again, from the tree's data alone, so a
wrong formula in the tree module cannot make its own docs look right.
"""

from __future__ import annotations

import re
from pathlib import Path

from castor import tree
from castor.supervision import Restart
from castor.supervision.supervisor import SUPERVISOR_SHUTDOWN_TIMEOUT

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _tree_block() -> str:
    text = (DOCS / "architecture.md").read_text()
    match = re.search(r"## The actor tree\n.*?```\n(.*?)```", text, re.S)
    assert match, "docs/architecture.md has no tree block under '## The actor tree'"
    return match.group(1).rstrip("\n")


def _limits_rows() -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for line in (DOCS / "supervision.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `/root"):
            rows[cells[0].strip("`")] = cells
    return rows


def _crashes_until_someone_gives_up(node: tree.Node) -> int:
    """Independent of tree.worst_case: walk the parents by their paths."""
    if node is tree.ROOT or node.restart is Restart.TEMPORARY:
        return 1
    parent = tree.BY_PATH[node.path.rsplit("/", 1)[0]]
    assert parent.intensity is not None
    if node.give_up is not None and node.give_up.max_restarts < parent.intensity.max_restarts:
        return node.give_up.max_restarts + 1
    product, here = 1, parent
    while True:
        assert here.intensity is not None
        product *= here.intensity.max_restarts + 1
        if here.restart is Restart.TEMPORARY or here.path == tree.ROOT.path:
            return product
        here = tree.BY_PATH[here.path.rsplit("/", 1)[0]]


def test_the_architecture_tree_block_is_the_tree_module():
    assert _tree_block() == tree.render_tree()
    block_paths = [line.split()[0] for line in _tree_block().splitlines()]
    assert block_paths == [node.path for node in tree.TREE]


def test_the_supervision_limits_table_is_the_tree_module():
    assert tree.render_limits() in (DOCS / "supervision.md").read_text()
    rows = _limits_rows()
    assert list(rows) == [node.path for node in tree.TREE]
    for node in tree.TREE:
        path, restart, strategy, intensity, give_up, shutdown, outcome = rows[node.path]
        assert restart == ("—" if node is tree.ROOT else node.restart.value)
        assert strategy == (node.strategy.value if node.strategy else "—")
        if node.intensity is None:
            assert intensity == "—"
        else:
            assert intensity == f"{node.intensity.max_restarts} in {node.intensity.within_seconds:g} s"
        if node.give_up is None:
            assert give_up == "—"
        else:
            assert give_up == f"{node.give_up.max_restarts} in {node.give_up.within_seconds:g} s"
        assert shutdown == f"{node.shutdown_timeout:g} s"
        assert outcome.split(":")[0] == str(_crashes_until_someone_gives_up(node)), node.path


def test_the_worst_case_product_is_stated_and_computed_the_same_way():
    products = {node.path: _crashes_until_someone_gives_up(node) for node in tree.TREE}
    assert products == {node.path: tree.worst_case(node)[0] for node in tree.TREE}
    deepest = max(products, key=lambda path: products[path])
    assert tree.deepest_product() == products[deepest]
    text = re.sub(r"\s+", " ", (DOCS / "supervision.md").read_text())
    assert f"The largest product in the tree is {products[deepest]}: that many crashes of `{deepest}`" in text


def test_supervisors_get_the_supervisor_shutdown_timeout_and_every_slot_has_a_parent():
    for node in tree.TREE:
        if node.is_supervisor:
            assert node.intensity is not None and node.shutdown_timeout == SUPERVISOR_SHUTDOWN_TIMEOUT
        if node is not tree.ROOT:
            assert node.path.rsplit("/", 1)[0] in tree.BY_PATH, node.path
            assert tree.BY_PATH[node.path.rsplit("/", 1)[0]].is_supervisor


def test_the_specs_built_from_the_tree_carry_its_numbers():
    cast = tree.CAST.child_spec(lambda: None, id="c1")  # never started
    assert (cast.restart, cast.shutdown_timeout, cast.max_restarts, cast.within_seconds) == (
        Restart.TRANSIENT, tree.CAST.shutdown_timeout, tree.CAST_GIVE_UP.max_restarts, tree.CAST_GIVE_UP.within_seconds)
    session = tree.SESSION.supervisor_spec([], id="s1", max_restarts=7)
    assert (session.id, session.restart, session.shutdown_timeout) == (
        "s1",
        Restart.TEMPORARY,
        SUPERVISOR_SHUTDOWN_TIMEOUT,
    )
