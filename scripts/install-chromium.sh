#!/usr/bin/env bash
# Install Chromium and chromedriver (Debian packages `chromium`, `chromium-driver`) for the web
# console's browser tests (tests/test_console_browser.py drives /usr/bin/chromium headless with
# Playwright; `playwright install` is never run, it would download browsers).
#
# Does nothing if both are there. Otherwise installs the packages as root with apt-get, without
# their recommended packages. Fails loudly where it cannot install: the tests fail, not skip,
# without a browser.
set -euo pipefail

if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "error: /usr/bin/chromium or /usr/bin/chromedriver is missing and only root on Debian" \
    "can install them here (apt-get install chromium chromium-driver)" >&2
  exit 1
fi

echo "chromium/chromedriver missing; installing the Debian packages chromium chromium-driver" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null

[ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]
echo "installed $(/usr/bin/chromium --version 2>/dev/null | head -n 1)" >&2
