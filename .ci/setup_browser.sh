#!/usr/bin/env bash
# Install what tests/test_browser.py needs: Debian's Chromium (/usr/bin/chromium; Playwright's own
# browser download cannot work here) and playwright-core (pinned in tests/browser/package-lock.json).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x /usr/bin/chromium ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
command -v node >/dev/null || { echo "setup_browser: node (Node.js >= 20) is missing" >&2; exit 1; }
(cd tests/browser && if [ -f package-lock.json ]; then npm ci --no-audit --no-fund --loglevel=error; else npm install --no-audit --no-fund --loglevel=error; fi)
echo "browser test env ready: $(/usr/bin/chromium --version 2>/dev/null) | playwright-core $(node -p "require('./tests/browser/node_modules/playwright-core/package.json').version")"
