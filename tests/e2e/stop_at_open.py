"""The real castor on stdio behind a pass-through that stops it (SIGSTOP) as the harness's
``session.open`` reaches it: castor has answered the handshake (the footer says it is up) and is
wedged before it answers the open. Test-only; the runtime itself is ``castor_serve.py``'s.

The stop is sent before the bytes carrying the open are passed on, so it is never answered, on a
fast machine or a slow one -- the moment a loaded machine hit by chance (a castor stopped between
its hello and its answer to the open), made certain.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

SERVE = Path(__file__).with_name("castor_serve.py")


def main() -> int:
    child = subprocess.Popen([sys.executable, str(SERVE), *sys.argv[1:]], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None

    def to_castor() -> None:
        stopped = False
        while chunk := os.read(0, 65536):
            if not stopped and b"session.open" in chunk:
                os.kill(child.pid, signal.SIGSTOP)
                stopped = True
            child.stdin.write(chunk)
            child.stdin.flush()
        child.stdin.close()

    threading.Thread(target=to_castor, daemon=True).start()
    while chunk := os.read(child.stdout.fileno(), 65536):
        os.write(1, chunk)
    return child.wait()


if __name__ == "__main__":
    sys.exit(main())
