#!/usr/bin/env bash
# The guarantee mutant suite (tools/mutants): every guarantee of docs/reliability.md and
# docs/supervision.md broken on purpose in a scratch copy, its backing tests run against it.
# Fails if a mutant survives, if a mutant's snippet no longer matches the code exactly once,
# or if the backing tests fail on the unmutated tree. Two workers; a few minutes on 2 cores.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec python -m tools.mutants --workers "${CASTOR_MUTANT_WORKERS:-2}" "$@"
