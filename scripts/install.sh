#!/usr/bin/env bash
# Install edgeopt with every host backend into ./.venv (Python 3.11), plus the fixture models.
#   bash scripts/install.sh           # the toolkit + backends + fixtures
#   bash scripts/install.sh --test    # also test tools, openssh-server and chromium (needs root/apt)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements/full.txt
.venv/bin/python -m pip install -q --no-deps -r requirements/fixtures.txt
.venv/bin/python -m pip install -q --no-deps -e .
if [ "${1:-}" = "--test" ]; then
  .venv/bin/python -m pip install -q -r requirements/test.txt
  need=()
  [ -x /usr/sbin/sshd ] || need+=(openssh-server)
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  if [ ${#need[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
  fi
fi
echo "edgeopt installed in .venv ($(.venv/bin/edgeopt --version))"
