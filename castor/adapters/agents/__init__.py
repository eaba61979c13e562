"""Standalone agent adapters (AgentPort implementations) for ``castor cast`` and tests.

``make_agent(spec)`` builds one from the CLI's ``--agent`` value:
``script:FILE`` (a :class:`ScriptedAgent`) or ``openai:BASE_URL[#MODEL]``
(an :class:`OpenAIChatAgent`). A malformed spec raises ``InvalidParams``.
"""

from __future__ import annotations

from castor.adapters.agents.factory import make_agent

__all__ = ["make_agent"]
