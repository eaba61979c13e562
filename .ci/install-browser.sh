#!/usr/bin/env bash
# Install the headless browser of the console's browser tests (tests/console, marker `browser`):
# Debian's `chromium` and `chromium-driver` packages. Nothing else downloads a browser or a
# driver: the tests drive /usr/bin/chromium through /usr/bin/chromedriver with selenium (a
# Python package in the `test` extra), given both paths explicitly.
#
# Needs root (CI runs as root) and apt. Idempotent: does nothing when both binaries work.
# Exits non-zero on any failure.
set -euo pipefail

have() { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 \
         && chromedriver --version >/dev/null 2>&1; }

if have; then
  echo "install-browser: $(chromedriver --version | head -1) already installed"
  exit 0
fi
command -v apt-get >/dev/null || { echo "install-browser: apt-get not found (Debian/Ubuntu only)" >&2; exit 1; }
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver
have || { echo "install-browser: chromium/chromedriver still not usable after apt-get install" >&2; exit 1; }
echo "install-browser: $(chromedriver --version | head -1) at $(command -v chromedriver)"
