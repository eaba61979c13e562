"""castor's bundled default materia config (layer 1 of 4), written for castor.

Loadouts:

- ``hello`` — one text socket that answers the request (the smallest possible cast).
- ``plan`` — a multi-turn planning conversation that, on ``continue``, emits work items, then
  a short plain-text plan summary.
- ``build`` (active) — the full build loop::

      Socket-1 utility project.ensureIgnored (json) → Socket-2 utility vcs.detect (json)
      → Socket-3 planner [generator, json] → loop "items" over state.workItems:
            Socket-4 builder (text) → Socket-5 reviewer (json)
              satisfied → Socket-6 (next item, advances the cursor) → Socket-4
              not_satisfied → Socket-4 (rework, at most 6 per cast)
        loop exit: Socket-6 always → Socket-7 summarizer (text) → end

  ``Socket-6`` is a ``noop`` utility: it moves the work-item cursor without an agent turn. It
  exists so "next item" and "rework" are different edges with their own traversal counters.

The prompts are castor's own. :func:`default_config` returns a fresh deep copy each call.
"""

from __future__ import annotations

import copy
from typing import Any

DEFAULT_LABEL = "castor:bundled-default"

_GREETER = (
    "You are the only step of a one-step cast. Read the request below and answer it directly and "
    "briefly. If it asks for changes to files, describe what you would change instead of changing it.\n\n"
    "Request: {{request}}"
)

_PLANNER = (
    "You are the planning step of a build cast. Break the request into a short ordered list of "
    "independent, testable work items (usually 1 to 5). Each item needs a stable id, a title, a "
    "description of the change, and acceptance criteria someone could check. Record shared context "
    "(conventions, constraints) under guidance.\n\n"
    "Request: {{request}}\n\nWhat is known about the repository:\n"
    "- version control: {{vcs}}\n"
)

_INTERACTIVE_PLANNER = (
    "You are planning work together with the user before anything is built. Ask the questions that "
    "matter, propose a breakdown into work items, and revise it as the user answers. Keep each reply "
    "short.\n\nRequest: {{request}}"
)

_BUILDER = (
    "You are the build step. Implement exactly the current work item in the repository, then stop.\n"
    "Keep the change small and focused; run the checks the item names if you can.\n\n"
    "Request: {{request}}\n"
    "Work item: {{item.title}}\n{{item.description}}\n"
    "Acceptance criteria: {{item.acceptance}}\n"
    "Reviewer feedback from the previous attempt (empty on the first attempt): {{lastFeedback}}"
)

_REVIEWER = (
    "You are the review step. Check the work just done for the current work item against its "
    "acceptance criteria by reading the repository (you cannot edit). Set satisfied to true only if "
    "every criterion is met; otherwise set it to false, explain what is wrong in feedback and list "
    "unmet criteria in missing.\n\n"
    "Work item: {{item.title}}\nAcceptance criteria: {{item.acceptance}}\n"
    "Builder's report:\n{{lastOutput}}"
)

_SUMMARIZER = (
    "You are the final step. Write a short report for the user: what was requested, what was done "
    "for each work item, and anything left open. Do not change files.\n\n"
    "Request: {{request}}\nWork items: {{workItems}}"
)

_PLAN_SUMMARIZER = (
    "Summarise the agreed plan for the user in a few lines: the work items in order and the main "
    "risks. Do not change files.\n\nWork items: {{workItems}}"
)

_DEFAULT: dict[str, Any] = {
    "artifactDir": ".pi/pi-materia",
    "activeLoadout": "build",
    "limits": {"maxSocketVisits": 50, "maxEdgeTraversals": 50},
    "budget": {"maxTokens": 4_000_000, "maxCostUsd": 20, "warnAtPercent": 75, "stopAtLimit": True},
    "materia": {
        "greeter": {"prompt": _GREETER, "tools": "readOnly", "label": "Greeter",
                    "description": "Answers a request in one turn."},
        "planner": {"prompt": _PLANNER, "tools": "readOnly", "generator": True, "thinking": "medium",
                    "label": "Planner", "description": "Turns a request into work items."},
        "interactivePlanner": {"prompt": _INTERACTIVE_PLANNER, "tools": "readOnly", "generator": True,
                               "multiTurn": True, "label": "Interactive planner",
                               "description": "Plans with the user; /materia continue finalises."},
        "builder": {"prompt": _BUILDER, "tools": "coding", "label": "Builder",
                    "description": "Implements one work item."},
        "reviewer": {"prompt": _REVIEWER, "tools": "readOnly", "label": "Reviewer",
                     "description": "Accepts or rejects the current work item."},
        "summarizer": {"prompt": _SUMMARIZER, "tools": "readOnly", "label": "Summarizer",
                       "description": "Reports the outcome of the cast."},
        "planSummarizer": {"prompt": _PLAN_SUMMARIZER, "tools": "none", "label": "Plan summary",
                           "description": "Summarises an agreed plan."},
        "ensureArtifactsIgnored": {"type": "utility", "utility": "project.ensureIgnored",
                                   "params": {"patterns": [".pi/pi-materia/"]}, "parse": "json",
                                   "label": "Ignore artifacts"},
        "detectVcs": {"type": "utility", "utility": "vcs.detect", "parse": "json", "label": "Detect VCS"},
    },
    "loadouts": {
        "hello": {
            "entry": "Socket-1",
            "sockets": {"Socket-1": {"type": "agent", "materia": "greeter"}},
        },
        "plan": {
            "entry": "Socket-1",
            "sockets": {
                "Socket-1": {"type": "agent", "materia": "interactivePlanner", "parse": "json",
                             "assign": {"workItems": "$.workItems"},
                             "edges": [{"when": "always", "to": "Socket-2"}]},
                "Socket-2": {"type": "agent", "materia": "planSummarizer"},
            },
        },
        "build": {
            "entry": "Socket-1",
            "sockets": {
                "Socket-1": {"type": "utility", "utility": "project.ensureIgnored",
                             "params": {"patterns": [".pi/pi-materia/"]}, "parse": "json",
                             "assign": {"artifactIgnore": "$"},
                             "edges": [{"when": "always", "to": "Socket-2"}]},
                "Socket-2": {"type": "utility", "utility": "vcs.detect", "parse": "json",
                             "assign": {"vcs": "$"}, "edges": [{"when": "always", "to": "Socket-3"}]},
                "Socket-3": {"type": "agent", "materia": "planner", "parse": "json",
                             "assign": {"workItems": "$.workItems"},
                             "edges": [{"when": "always", "to": "Socket-4"}]},
                "Socket-4": {"type": "agent", "materia": "builder",
                             "edges": [{"when": "always", "to": "Socket-5"}]},
                "Socket-5": {"type": "agent", "materia": "reviewer", "parse": "json",
                             "assign": {"lastFeedback": "$.feedback"},
                             "edges": [{"when": "satisfied", "to": "Socket-6"},
                                       {"when": "not_satisfied", "to": "Socket-4", "maxTraversals": 6}]},
                "Socket-6": {"type": "utility", "utility": "noop",
                             "edges": [{"when": "always", "to": "Socket-4"}]},
                "Socket-7": {"type": "agent", "materia": "summarizer"},
            },
            "loops": {
                "items": {
                    "label": "Build each work item",
                    "sockets": ["Socket-4", "Socket-5", "Socket-6"],
                    "consumes": {"from": "Socket-3", "output": "workItems"},
                    "exit": {"from": "Socket-6", "when": "always", "to": "Socket-7"},
                    # An empty work list enters the loop at Socket-4: this route takes it to the
                    # summary (with no route from the entered member the cast would end there).
                    "exits": [{"id": "exit:Socket-4:always", "from": "Socket-4", "condition": "always",
                               "targetSocketId": "Socket-7"}],
                }
            },
        },
    },
}


def default_config() -> dict[str, Any]:
    """A fresh copy of the bundled default (callers may mutate it)."""
    return copy.deepcopy(_DEFAULT)
