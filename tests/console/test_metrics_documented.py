"""Every metric ``/metrics`` serves is in docs/operations.md (and metrics.py's own table) with its
type and labels, and every metric the docs list is served: a dashboard built from the docs finds
each series it was told of."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]
_ROW = re.compile(r"^\|\s*`(castor_[a-z_]+)(?:\{([a-z_,]*)\})?`\s*\|\s*(gauge|counter|histogram)\s*\|")


def _documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    section = text.split("## `/metrics`", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = _ROW.match(line)
        if match:
            name, labels, kind = match.groups()
            rows[name] = (kind, tuple(sorted(filter(None, (labels or "").split(",")))))
    return rows


def _module_table() -> dict[str, tuple[str, tuple[str, ...]]]:
    from castor.console import metrics

    rows = {}
    for line in (metrics.__doc__ or "").splitlines():
        match = re.match(r"^(castor_[a-z_]+)(?:\{([a-z_,]*)\})?\s+(gauge|counter|histogram)\s", line)
        if match:
            name, labels, kind = match.groups()
            rows[name] = (kind, tuple(sorted(filter(None, (labels or "").split(",")))))
    return rows


def _served() -> dict[str, tuple[str, tuple[str, ...]]]:
    from castor.console.metrics import RuntimeCollector
    from castor.runtime import Runtime, RuntimeSettings

    runtime = Runtime(RuntimeSettings())
    try:
        families = list(RuntimeCollector(runtime).collect())
    finally:
        runtime.shutdown(10)
    served = {}
    for family in families:
        name = family.name + ("_total" if family.type == "counter" else "")
        served[name] = (family.type, tuple(sorted(family._labelnames)))  # the labels it declares
    return served


def test_the_metrics_served_are_exactly_the_documented_ones():
    served = _served()
    assert served == _documented()
    assert served == _module_table()


def _documented_columns(view: str) -> list[str]:
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith(f"| `{view}"))
    return [c.strip() for c in row.split("its columns:", 1)[1].split("|", 1)[0].split(",")]


def test_the_inspect_tables_have_exactly_the_documented_columns():
    from castor.console.terminal import actor_list, casts_table

    assert [c.header for c in actor_list([], "age").columns] == _documented_columns("--sort oldest")
    assert [c.header for c in casts_table([]).columns] == _documented_columns("casts")


def test_the_consoles_tables_have_exactly_the_documented_fields():
    """The main page's tree columns and the cast page's facts are the ones docs/operations.md names."""
    from castor.console import pages

    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    tree_row = next(line for line in text.splitlines() if line.startswith("| `/` |"))
    documented = tree_row.split("whose columns are:", 1)[1]
    headers = re.findall(r"<th>([^<]*)</th>", pages.tree_page())
    for header in filter(None, headers):
        assert header in documented, header
    cast_row = next(line for line in text.splitlines() if line.startswith("| `/cast/"))
    facts = pages._CAST_JS.split("for (const [k, v] of [", 1)[1].split("]]) {", 1)[0]
    names = re.findall(r"\['([a-z ()A-Z]+)'", facts)
    assert len(names) == 10, names
    for name in names:
        word = {"cost (USD)": "cost", "failed": "failure reason", "doing": "what it does now"}.get(name, name)
        assert word in cast_row, name


def test_every_kind_that_started_has_a_zero_sample_of_each_counter_before_it_counts():
    """``castor_crashes_total`` (and the restarts, retirements, ask timeouts) had no series at all
    until a kind's first crash, which then appeared at 1: ``increase(...[5m])`` sees no increase
    in a series that starts at 1, so an alert on it never fired for the first crash. Each kind
    that started has a 0 sample now; a crash makes it 1."""
    from prometheus_client.parser import text_string_to_metric_families

    from castor.console.metrics import metrics_text
    from castor.runtime import Runtime, RuntimeSettings

    def samples(runtime) -> dict[tuple[str, str], float]:
        text = metrics_text(runtime).decode()
        return {(s.name, s.labels.get("kind", "")): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    runtime = Runtime(RuntimeSettings())
    try:
        before = samples(runtime)
        for name in ("castor_crashes_total", "castor_restarts_total", "castor_retirements_total",
                     "castor_ask_timeouts_total"):
            assert before[(name, "UtilityExecutorActor")] == 0, name
            assert before[(name, "Supervisor")] == 0, name
        assert before[("castor_starts_total", "UtilityExecutorActor")] >= 1
        from castor.supervision import faults

        slot = runtime.system.lookup("/root/utility/slot-0")
        faults.kill(slot)
        from tests.support.waiting import wait_for

        wait_for(lambda: samples(runtime)[("castor_restarts_total", "UtilityExecutorActor")] == 1, timeout=10,
                 what="the slot's restart")
        after = samples(runtime)
        assert after[("castor_crashes_total", "UtilityExecutorActor")] == 1
        assert after[("castor_crashes_total", "Supervisor")] == 0
    finally:
        runtime.shutdown(10)


def test_the_unlabelled_histograms_are_served_at_zero_before_their_first_observation():
    """``castor_utility_run_seconds`` and ``castor_memory_trim_seconds`` had no sample until the first
    command ran (or the first trim): the first observation made a new series instead of an increase,
    which ``increase(...[5m])`` and ``histogram_quantile`` over a rate do not see."""
    from castor.console.metrics import metrics_text
    from castor.runtime import Runtime, RuntimeSettings

    runtime = Runtime(RuntimeSettings())
    try:
        text = metrics_text(runtime).decode()
    finally:
        runtime.shutdown(10)
    for name in ("castor_utility_run_seconds", "castor_memory_trim_seconds"):
        assert f'{name}_bucket{{le="+Inf"}} 0.0' in text, name
        assert f"{name}_count 0.0" in text and f"{name}_sum 0.0" in text
        assert f'{name}_bucket{{le="300.0"}} 0.0' in text
    assert "castor_utility_runs_total 0.0" in text


def test_the_casts_view_with_no_session_open_says_so():
    """``castor inspect casts`` on a castor with no session drew an empty table, which reads as a
    view that failed to load; it now says that no session is open."""
    import io

    from rich.console import Console

    from castor.console.terminal import casts_table

    out = Console(file=io.StringIO(), width=200, record=True)
    out.print(casts_table([]))
    assert "no open sessions" in out.export_text()


def test_the_console_s_bounds_and_attention_rules_are_the_documented_ones():
    """The figures docs/operations.md gives for the console's page (rows drawn, casts on a card,
    entries of "needs attention", characters of a cell, when an actor is stuck, when a page is
    stale) are the ones the page's script is given."""
    from castor.console import pages

    text = " ".join((ROOT / "docs" / "operations.md").read_text(encoding="utf-8").split())
    assert f"the first {pages.MAX_TREE_ROWS} actors its filter" in text
    assert f"a session's card lists {pages.MAX_CARD_CASTS} casts" in text
    assert f"{pages.MAX_CARDS} session cards and {pages.MAX_CARDS} worker cards are drawn" in text
    assert (f"the newest {pages.MAX_CARD_ENDED} of its project's casts not running here, up to "
            f"{pages.MAX_ENDED_PER_SESSION} a session") in text
    assert f"the newest {pages.SAVED_SCAN} under its artifact root, again every {pages.SAVED_REREAD_S:g} s" in text
    assert f"every cast of the session's project, {pages.CASTS_PAGE} a page" in text
    assert f"a push waits for {pages.SAVED_WAIT_S:g} s at most" in text
    assert f"(the first {pages.MAX_ATTENTION}, then how many more)" in text
    assert f"cut to {pages.MAX_CELL_CHARS} characters" in text and f"up to {pages.MAX_TITLE_CHARS:,}" in text
    assert text.count(f" {pages.STUCK_AFTER_S:g} s or more") == 2
    assert pages.RECENT_FAILURE_S == 60 and "failed within the last minute" in text
    assert f"when no push has come for {pages.STALE_AFTER_S:g} s" in text
    assert pages.RETRY_FIRST_MS == 500 and "half a second after the drop" in text
    assert f"up to {pages.RETRY_MAX_MS // 1000} s" in text
    script = pages.tree_page()
    for name, value in (("MAX_ROWS", pages.MAX_TREE_ROWS), ("STUCK_AFTER", pages.STUCK_AFTER_S),
                        ("STALE_AFTER", pages.STALE_AFTER_S), ("RECENT_FAILURE", pages.RECENT_FAILURE_S),
                        ("RETRY_FIRST", pages.RETRY_FIRST_MS), ("RETRY_MAX", pages.RETRY_MAX_MS)):
        assert f"const {name} = {json.dumps(value)};" in script, name
