"""Only ``fabric_search``."""

import json


def fabric_search(args, **_kwargs):
    return json.dumps({"query": args.get("query"), "count": 0, "results": []})
