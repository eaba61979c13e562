"""Die or answer: the one rule of this fake package."""

import os


def die_unless_healthy(answer):
    marker = os.environ.get("ICARUS_FAKE_HEALTHY")
    if marker and os.path.exists(marker):
        return answer
    os._exit(3)  # the worker process ends under the call, as a backend that exits would
