"""Fabric tools of the slow fake: they answer at once (see the package's docstring)."""


def fabric_search(_params):
    return {"results": []}


def fabric_brief(_params):
    return {"brief": ""}
