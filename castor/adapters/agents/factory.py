"""``--agent`` spec → AgentPort: ``script:FILE`` or ``openai:BASE_URL[#MODEL]``.

Failure behaviour: an unknown scheme or empty value raises ``InvalidParams``;
a bad script file raises ``InvalidConfig`` (from the scripted adapter).
"""

from __future__ import annotations

from castor.adapters.agents.openai_http import OpenAIChatAgent
from castor.adapters.agents.scripted import ScriptedAgent
from castor.messages.errors import InvalidParams

__all__ = ["make_agent"]


def make_agent(spec: str, *, deadline_s: float = 300.0) -> ScriptedAgent | OpenAIChatAgent:
    scheme, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise InvalidParams(f"agent spec must be script:FILE or openai:BASE_URL[#MODEL], got {spec!r}",
                            data={"reason": "bad_agent_spec"})
    if scheme == "script":
        return ScriptedAgent(rest)
    if scheme == "openai":
        base_url, _, model = rest.partition("#")
        return OpenAIChatAgent(base_url, model=model or None, deadline_s=deadline_s)
    raise InvalidParams(f"unknown agent scheme {scheme!r} (script, openai)", data={"reason": "bad_agent_spec"})
