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
  command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
  command -v qemu-aarch64-static >/dev/null 2>&1 || need+=(qemu-user-static binfmt-support)
  if [ ${#need[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  if [ "$(id -u)" = 0 ]; then
    # An emulated Debian arm64 board for tests/devices/test_emulated_arm.py (Debian's packages + PyPI's
    # aarch64 wheels; 13-19 min the first time on 2 cores, then cached in ~/.cache/edgeopt/devices).
    # Bounded: a root not built in time leaves its test marked slow. bullseye is built on demand
    # (scripts/make_device.py --suite bullseye) and tested when its root is cached.
    timeout 1500 .venv/bin/python scripts/make_device.py --suite bookworm --build-only \
      || echo "bookworm arm64 root not built: its test stays slow"
  fi
fi
echo "edgeopt installed in .venv ($(.venv/bin/edgeopt --version))"
