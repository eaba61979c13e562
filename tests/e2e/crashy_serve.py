"""``castor serve --stdio`` (the real runtime) that crashes its cast actors on request, for the
real-Pi tests of what a user sees when castor restarts a crashed cast's actor mid-turn.

A watcher thread polls for the file ``$CASTOR_CRASH_CAST_FILE``; when it appears, the file is
removed and every live cast actor of the runtime is killed (``castor.supervision.faults.kill``, as
the soak's ``kill_cast`` fault does): its supervisor restarts it, and the restart stops the turn
the harness runs (``agent.abort_turn``, ``cast_restarted``) and sends it again under a new id.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any


def watch(runtime: Any, marker: Path) -> None:
    from castor.supervision import faults
    from castor.testing.faults import fault_targets

    while True:
        if marker.exists():
            marker.unlink()
            for handle in fault_targets(runtime.system.registry, "cast"):
                faults.kill(handle, "test: crash the cast actor")
        time.sleep(0.02)  # polling a file another process creates


def main() -> None:
    import castor.endpoint.app as app
    from castor.cli import main as castor_main

    build = app.build_dispatcher
    marker = Path(os.environ["CASTOR_CRASH_CAST_FILE"])

    def build_and_watch(runtime: Any) -> Any:
        threading.Thread(target=watch, args=(runtime, marker), name="crash-cast", daemon=True).start()
        return build(runtime)

    app.build_dispatcher = build_and_watch
    sys.exit(castor_main(["serve", "--stdio", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
