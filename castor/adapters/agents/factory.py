"""``--agent`` spec → AgentPort: ``script:FILE`` or ``openai:BASE_URL[#MODEL]``.

Failure behaviour: an unknown scheme or empty value raises ``InvalidParams``;
a bad script file raises ``InvalidConfig`` (from the scripted adapter).
"""

from __future__ import annotations

from castor.adapters.agents.openai_http import OpenAIChatAgent
from castor.adapters.agents.scripted import ScriptedAgent
from castor.messages.errors import InvalidParams

__all__ = ["make_agent"]


AGENT_SCHEMES = ("script", "openai")


def agent_spec_problem(spec: str | None) -> str | None:
    """What is wrong with an agent spec's form (``script:FILE`` / ``openai:BASE_URL[#MODEL]``), checked
    before anything starts; None when it is well formed (or absent). The file or URL itself is
    checked when the agent is made."""
    if spec is None:
        return None
    scheme, sep, rest = spec.partition(":")
    if not sep or not rest or scheme not in AGENT_SCHEMES:
        return f"agent spec must be script:FILE or openai:BASE_URL[#MODEL], got {spec[:120]!r}"
    return None


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
