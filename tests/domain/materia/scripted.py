"""Test helper: drive the pure cast engine with scripted outcomes (no threads, no IO).

``Driver`` keeps the current state, applies events through ``engine.step`` and remembers every
effect. ``answer(...)`` replies to the one outstanding effect (agent turn, utility or compaction).
The "agent" here is a script of texts — a stand-in for an LLM, which cannot exist in unit tests.
"""

from __future__ import annotations

import json
from typing import Any

from castor.domain.materia.cast_messages import (
    CastStarted,
    Compact,
    CompactionFinished,
    EmitEvent,
    RunAgentTurn,
    RunUtility,
    TurnEnded,
    UtilityFinished,
    WriteArtifact,
)
from castor.domain.materia.config import ResolvedConfig
from castor.domain.materia.defaults import DEFAULT_LABEL, default_config
from castor.domain.materia.engine import Transition, step
from castor.domain.materia.resolve import load_config, resolve_config
from castor.domain.materia.state import CastState


def resolved(
    config: dict[str, Any] | None = None, loadout: str | None = None, *, over_default: bool = False
) -> ResolvedConfig:
    layers = [(DEFAULT_LABEL, default_config())] if over_default or config is None else []
    if config is not None:
        layers.append(("test.json", config))
    return resolve_config(load_config(layers), loadout)


def agent(prompt: str = "Do {{request}}", tools: str = "coding", **extra: Any) -> dict[str, Any]:
    return {"prompt": prompt, "tools": tools, **extra}


def config(sockets: dict[str, Any], *, materia: dict[str, Any] | None = None, loops: dict[str, Any] | None = None,
           **top: Any) -> dict[str, Any]:
    loadout: dict[str, Any] = {"entry": next(iter(sockets)), "sockets": sockets}
    if loops:
        loadout["loops"] = loops
    return {"materia": materia or {"A": agent(), "J": agent(), "G": agent(generator=True)},
            "loadouts": {"L": loadout}, "activeLoadout": "L", **top}


class Driver:
    def __init__(self, cfg: ResolvedConfig, request: str = "do it", cast_id: str = "cast-1",
                 data: dict[str, Any] | None = None) -> None:
        self.t = 0.0
        self.transitions: list[Transition] = []
        self.state: CastState | None = None
        self._apply(CastStarted(cast_id=cast_id, request=request, config=cfg, cwd="/w", run_dir="/w/run",
                                artifact_root="/w", data=data or {}, at=self._tick()))

    def _tick(self) -> float:
        self.t += 1.0
        return self.t

    def _apply(self, event: Any) -> Transition:
        # Every step of every scripted test also proves purity: the input state is unchanged
        # afterwards, whether the step succeeded or was rejected (the engine shares structure
        # between states, so a mutation in place would show up here).
        before = self.state.model_dump() if self.state is not None else None
        try:
            tr = step(self.state, event)
        finally:
            if self.state is not None:
                assert self.state.model_dump() == before, "engine.step mutated its input state"
        self.transitions.append(tr)
        self.state = tr.state
        return tr

    def send(self, event_cls: type, **fields: Any) -> Transition:
        return self._apply(event_cls(at=self._tick(), **fields))

    # -------------------------------------------------------------- what is outstanding
    @property
    def effects(self) -> list[Any]:
        return [e for tr in self.transitions for e in tr.effects]

    def last_work(self) -> Any:
        for e in reversed(self.effects):
            if isinstance(e, (RunAgentTurn, RunUtility, Compact)):
                return e
        raise AssertionError("no work effect was ever produced")

    def pending(self) -> Any:
        assert self.state is not None and self.state.pending is not None, "cast is not waiting for work"
        work = self.last_work()
        assert work.visit_id == self.state.pending.visit_id
        return work

    # -------------------------------------------------------------- answers
    def reply(self, text: Any, **fields: Any) -> Transition:
        work = self.pending()
        assert isinstance(work, RunAgentTurn), f"expected an agent turn, got {work.kind}"
        if not isinstance(text, str):
            text = json.dumps(text)
        return self.send(TurnEnded, visit_id=work.visit_id, text=text, **fields)

    def fail_turn(self, error: str, text: str | None = None, **fields: Any) -> Transition:
        work = self.pending()
        return self.send(TurnEnded, visit_id=work.visit_id, text=text, error=error, stop_reason="error", **fields)

    def utility(self, stdout: Any = "", **fields: Any) -> Transition:
        work = self.pending()
        assert isinstance(work, RunUtility), f"expected a utility, got {work.kind}"
        if not isinstance(stdout, str):
            stdout = json.dumps(stdout)
        return self.send(UtilityFinished, visit_id=work.visit_id, stdout=stdout, **fields)

    def compacted(self, ok: bool = True, **fields: Any) -> Transition:
        work = self.pending()
        assert isinstance(work, Compact)
        return self.send(CompactionFinished, visit_id=work.visit_id, ok=ok, **fields)

    def run_script(self, replies: list[Any]) -> None:
        for reply in replies:
            work = self.pending()
            if isinstance(work, RunUtility):
                self.utility(reply)
            else:
                self.reply(reply)

    # -------------------------------------------------------------- inspection
    def events(self, type_: str | None = None) -> list[EmitEvent]:
        return [e for e in self.effects if isinstance(e, EmitEvent) and (type_ is None or e.type == type_)]

    def event_types(self) -> list[str]:
        return [e.type for e in self.events()]

    def artifacts(self) -> dict[str, WriteArtifact]:
        return {"/".join(e.path): e for e in self.effects if isinstance(e, WriteArtifact)}

    def turns(self) -> list[RunAgentTurn]:
        return [e for e in self.effects if isinstance(e, RunAgentTurn)]
