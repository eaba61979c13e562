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

The names pi-materia's bundled default offers are offered too, so a pi-materia project config
that refers to them loads and runs: the materia ``planner``, ``interactivePlan``,
``Auto-Architect``, ``Chain-Context``, ``Build``, ``Auto-Eval``, ``Maintain``, ``GitMaintain``,
``Narrate``, ``Auto-Plan``, ``Interactive-Plan``, ``ensureArtifactsIgnored``, ``detectVcs`` and
``Detect-VCS``, and the loadouts ``Full-Auto``, ``Planning-Consult`` and ``Hojo-Consult``. Their
structure and settings (type, tools, parse, thinking, multiTurn, generator, utility, params,
assign; sockets, edges, limits, advance, loops) are pi-materia's, and they carry no setting
pi-materia's definition lacks — so a user's definition of one of these names merges over
castor's exactly as it would over pi-materia's (layering: :mod:`castor.domain.materia.layers`).
Only the prompt text (and UI labels) are castor's own words.

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


# ----------------------------------------------------------------------------- pi-materia's names
# Prompts in castor's own words for the materia names pi-materia users know. The runtime adds
# the handoff contract (JSON sockets) and the work-item context (text sockets) itself.

_PI_PLAN = (
    "You plan software work. Split the request into a few small work items, in the order they "
    "should be done, each with a stable id, a title, a description of the change and acceptance "
    "criteria that can be checked. If the repository looks new or lacks basic hygiene (version "
    "control, ignore rules, a project skeleton, documented run and test commands), make setting "
    "that up the first item; prefer jj when it is installed and no repository exists yet, else git. "
    "The cast's artifact directory is already ignored. A finished plan sets satisfied to true.\n\n"
    "Version control found: {{state.vcs}}\n\nRequest: {{request}}"
)

_PI_INTERACTIVE_PLAN = (
    "You plan software work together with the user, over several turns, before anything is built. "
    "Start by restating the request and what you can tell about the repository; then ask the "
    "questions that matter and propose a breakdown into small ordered work items with checkable "
    "acceptance criteria, revising it as the user answers. While you are still talking it over, "
    "answer in plain conversation and do not emit the final work items. Only /materia continue "
    "ends the conversation: when the plan looks settled, or the talk goes in circles, suggest it. "
    "If the repository looks new or lacks basic hygiene, the final plan starts with an item that "
    "sets it up (jj when installed and no repository exists, else git).\n\n"
    "Version control found: {{state.vcs}}\n\nRequest: {{request}}"
)

_PI_ARCHITECT = (
    "You review the planned work items as a software architect before they are built. Check the "
    "boundaries, data shapes, dependencies and risks each item implies; favour the simplest design "
    "that can grow. Sharpen or extend the work items so each can be built and checked on its own, "
    "put architecture advice under guidance (and in each item's context.architecture), record the "
    "choices you made under decisions and the risks you see under risks, and keep whatever useful "
    "summary, guidance, decisions and risks came before. Be brief and concrete.\n\n"
    "Planned work items: {{state.workItems}}\n\nRequest: {{request}}"
)

_PI_CHAIN_CONTEXT = (
    "You turn what an earlier cast left behind into a short handoff for the next step. Read the "
    "earlier cast's state below and keep only what the next step needs: a summary, the work "
    "items still open, guidance, decisions and risks. If there is no earlier state, say so: set "
    "satisfied to false, explain in feedback, and list \"state.previousCastContext\" under "
    "missing; never invent history.\n\n"
    "Earlier cast state: {{state.previousCastContext}}\n\nRequest: {{request}}"
)

_PI_BUILD = (
    "You build one work item. Make exactly the change the current work item asks for, in small "
    "safe steps, following the cast's guidance. For a setup item, look at the directory first, "
    "create the project skeleton, set up version control (jj when installed and no repository "
    "exists, else git) and ignore rules for build output and .pi/pi-materia/. Run the checks that "
    "apply, then stop and report what changed, or what blocks you.\n\n"
    "Work item {{item.id}}: {{item.title}}\n{{item.description}}\n\n"
    "Acceptance criteria: {{item.acceptance}}\n\nGuidance: {{state.guidance}}\n\n"
    "Feedback on the previous attempt (empty on the first): {{state.lastFeedback}}"
)

_PI_EVAL = (
    "You check one work item, strictly. Look at the repository and decide whether the work just "
    "done meets every acceptance criterion of the current item. Set satisfied to true only if it "
    "does; otherwise set it to false, say what is wrong in feedback and list what is missing. Keep "
    "the summary, guidance, decisions and risks that came before.\n\n"
    "Work item: {{itemJson}}\n\nWhat the build step reported: {{lastOutput}}"
)

_PI_MAINTAIN = (
    "You checkpoint one accepted work item in version control, without asking. Look at the "
    "repository state first (jj status and jj diff, or git status and git diff). With no real "
    "change, create nothing: set satisfied to true, checkpointCreated to false and say the "
    "checkpoint was skipped. With changes: in a jj repository describe the change with a short "
    "message naming the item and then run jj new, so the next item starts on a fresh change; "
    "with git only, stage everything and commit; with no repository, create one first (jj when "
    "installed, else git). Never commit .pi/pi-materia/. Report commitMessage, reason, vcs, "
    "checkpointCreated and the commands you ran, and set satisfied to true once the item is "
    "checkpointed (false if it could not be).\n\n"
    "Work item: {{item.id}} {{item.title}}\nVersion control found: {{state.vcs}}"
)

_PI_GIT_MAINTAIN = (
    "You commit one accepted work item with git, without asking. Look at git status and git diff "
    "first. With no real change, commit nothing: set satisfied to true, checkpointCreated to false "
    "and say the commit was skipped. With changes, stage everything and commit with a short message "
    "naming the item (create the repository first if there is none). Never commit .pi/pi-materia/ "
    "and do not use jj. Report commitMessage, reason, vcs, checkpointCreated and the commands you "
    "ran.\n\nWork item: {{item.id}} {{item.title}}"
)

_PI_NARRATE = (
    "You write the cast's closing report for the user, in markdown. Cover the whole cast, not its "
    "last turn: every work item that was planned or refined, and what became of it (done, checked, "
    "checkpointed, skipped, blocked or left open), the files and checks that mattered, commits or "
    "checkpoints made, and anything the user still has to do. The cast context is your index; the "
    "cast's artifact directory under .pi/pi-materia/ has the details (events, manifest, socket "
    "outputs) when you need them. Do not change files.\n\n"
    "Request: {{request}}\nWork items: {{state.workItems}}"
)

_LOOP_LABEL = "Build, check and checkpoint each work item"


def _ensure_ignored_socket(to: str) -> dict[str, Any]:
    return {"type": "utility", "utility": "project.ensureIgnored", "parse": "json",
            "params": {"patterns": [".pi/pi-materia/"]}, "assign": {"artifactIgnore": "$"},
            "edges": [{"when": "always", "to": to}], "socketKind": "entry"}


def _detect_vcs_socket(to: str) -> dict[str, Any]:
    return {"type": "utility", "utility": "vcs.detect", "parse": "json", "assign": {"vcs": "$"},
            "edges": [{"when": "always", "to": to}], "socketKind": "normal"}


def _agent(materia: str, parse: str, edges: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    sock: dict[str, Any] = {"type": "agent", "materia": materia, "parse": parse}
    if edges is not None:
        sock["edges"] = edges
    sock.update(extra)
    sock["socketKind"] = "normal"
    return sock


def _always(to: str) -> list[dict[str, Any]]:
    return [{"when": "always", "to": to}]


def _eval_edges(accept: str, rework: str, max_rework: int | None) -> list[dict[str, Any]]:
    back: dict[str, Any] = {"when": "not_satisfied", "to": rework}
    if max_rework is not None:
        back["maxTraversals"] = max_rework
    return [{"when": "satisfied", "to": accept}, back]


_ADVANCE = {"cursor": "workItemIndex", "items": "state.workItems", "done": "end", "when": "satisfied"}


def _pi_loadouts() -> dict[str, Any]:
    full_auto = {
        "entry": "Socket-1",
        "sockets": {
            "Socket-1": _ensure_ignored_socket("Socket-2"),
            "Socket-2": _detect_vcs_socket("Socket-3"),
            "Socket-3": _agent("Auto-Plan", "json", _always("Socket-8"), empty=False,
                               assign={"workItems": "$.workItems"}),
            "Socket-4": _agent("Build", "text", _always("Socket-5"), empty=False),
            "Socket-5": _agent("Auto-Eval", "json", _eval_edges("Socket-6", "Socket-4", 3),
                               assign={"lastFeedback": "$.feedback", "lastCheck": "$"}),
            "Socket-6": _agent("Maintain", "json", _always("Socket-4"), assign={"lastMaintain": "$"},
                               advance=dict(_ADVANCE)),
            "Socket-7": _agent("Narrate", "text", empty=False),
            "Socket-8": _agent("Auto-Architect", "json", _always("Socket-4"), empty=False,
                               assign={"workItems": "$.workItems"}),
        },
        "loops": {"loopSelection": {
            "label": _LOOP_LABEL,
            "consumes": {"from": "Socket-8", "output": "workItems"},
            "exit": {"from": "Socket-6", "when": "satisfied", "to": "end"},
            "exits": [{"id": "exit:Socket-6:always", "from": "Socket-6", "condition": "always",
                       "targetSocketId": "Socket-7"}],
            "sockets": ["Socket-4", "Socket-5", "Socket-6"],
        }},
    }
    planning_consult = {
        "entry": "Socket-1",
        "loops": {"taskIteration": {
            "label": _LOOP_LABEL,
            "exit": {"from": "Socket-6", "when": "satisfied", "to": "end"},
            "consumes": {"from": "Socket-3", "output": "workItems"},
            "sockets": ["Socket-4", "Socket-5", "Socket-6"],
        }},
        "sockets": {
            "Socket-1": _ensure_ignored_socket("Socket-2"),
            "Socket-2": _detect_vcs_socket("Socket-3"),
            "Socket-3": _agent("interactivePlan", "json", _always("Socket-4"), assign={"workItems": "$.workItems"}),
            "Socket-4": _agent("Build", "text", _always("Socket-5")),
            "Socket-5": _agent("Auto-Eval", "json", _eval_edges("Socket-6", "Socket-4", 3),
                               assign={"lastFeedback": "$.feedback", "lastCheck": "$"}),
            "Socket-6": _agent("Maintain", "json", _always("Socket-4"), advance=dict(_ADVANCE),
                               assign={"lastMaintain": "$"}),
        },
    }
    hojo_consult = {
        "entry": "Socket-1",
        "loops": {"loopSelection": {
            "label": _LOOP_LABEL,
            "consumes": {"from": "Socket-4", "output": "workItems"},
            "exit": {"from": "Socket-7", "when": "satisfied", "to": "end"},
            "exits": [{"id": "exit:Socket-7:always", "from": "Socket-7", "condition": "always",
                       "targetSocketId": "Socket-8"}],
            "sockets": ["Socket-5", "Socket-6", "Socket-7"],
        }},
        "sockets": {
            "Socket-1": {**_ensure_ignored_socket("Socket-2"), "empty": False},
            "Socket-2": {**_detect_vcs_socket("Socket-3"), "empty": False},
            "Socket-3": _agent("Interactive-Plan", "json", _always("Socket-4"), empty=False,
                               assign={"workItems": "$.workItems"}),
            "Socket-4": _agent("Auto-Architect", "json", _always("Socket-5"), empty=False,
                               assign={"workItems": "$.workItems"}),
            "Socket-5": _agent("Build", "text", _always("Socket-6"), empty=False),
            "Socket-6": _agent("Auto-Eval", "json", _eval_edges("Socket-7", "Socket-5", None), empty=False),
            "Socket-7": _agent("Maintain", "json", _always("Socket-5"), empty=False, advance=dict(_ADVANCE)),
            "Socket-8": _agent("Narrate", "text", empty=False),
        },
    }
    return {"Full-Auto": full_auto, "Planning-Consult": planning_consult, "Hojo-Consult": hojo_consult}


#: pi-materia's bundled materia names, with pi-materia's settings and castor's prompts.
_PI_MATERIA: dict[str, Any] = {
    "interactivePlan": {"tools": "readOnly", "multiTurn": True, "parse": "json", "generator": True,
                        "prompt": _PI_INTERACTIVE_PLAN},
    "Auto-Architect": {"type": "agent", "tools": "readOnly", "generator": True, "parse": "json",
                       "thinking": "medium", "prompt": _PI_ARCHITECT},
    "Chain-Context": {"type": "agent", "tools": "readOnly", "parse": "json", "prompt": _PI_CHAIN_CONTEXT},
    "Build": {"type": "agent", "tools": "coding", "parse": "text", "prompt": _PI_BUILD},
    "Auto-Eval": {"type": "agent", "tools": "readOnly", "parse": "json", "prompt": _PI_EVAL},
    "Maintain": {"type": "agent", "tools": "coding", "parse": "json", "prompt": _PI_MAINTAIN},
    "GitMaintain": {"tools": "coding", "parse": "json", "prompt": _PI_GIT_MAINTAIN},
    "Narrate": {"type": "agent", "tools": "readOnly", "parse": "text", "prompt": _PI_NARRATE},
    "Auto-Plan": {"type": "agent", "tools": "readOnly", "parse": "json", "generator": True, "prompt": _PI_PLAN},
    "Interactive-Plan": {"type": "agent", "tools": "readOnly", "parse": "json", "multiTurn": True,
                         "generator": True, "prompt": _PI_INTERACTIVE_PLAN},
    "Detect-VCS": {"type": "utility", "label": "Detect VCS", "group": "Utility", "utility": "vcs.detect",
                   "params": {}, "parse": "json"},
}

_DEFAULT: dict[str, Any] = {
    "artifactDir": ".pi/pi-materia",
    "activeLoadout": "build",
    "limits": {"maxSocketVisits": 50, "maxEdgeTraversals": 25},
    "budget": {"maxTokens": 4_000_000, "maxCostUsd": 20, "warnAtPercent": 75, "stopAtLimit": True},
    "materia": {
        "greeter": {"prompt": _GREETER, "tools": "readOnly", "label": "Greeter",
                    "description": "Answers a request in one turn."},
        # Shared with pi-materia's bundled names: the same settings (no thinking level of its own).
        # (no UI label either: a field pi-materia's planner lacks would survive in a user's planner)
        "planner": {"prompt": _PLANNER, "tools": "readOnly", "generator": True, "parse": "json"},
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
                                   "assign": {"artifactIgnore": "$"}, "label": "Ignore artifacts"},
        "detectVcs": {"type": "utility", "utility": "vcs.detect", "parse": "json", "assign": {"vcs": "$"},
                      "label": "Detect VCS"},
        **_PI_MATERIA,
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
        **_pi_loadouts(),
    },
}


def default_config() -> dict[str, Any]:
    """A fresh copy of the bundled default (callers may mutate it)."""
    return copy.deepcopy(_DEFAULT)
