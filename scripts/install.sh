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
  # The agent's oldest supported Python (3.8, as on JetPack 5) with JetPack 5's numpy (1.17.4, PyPI's wheel):
  # tests/devices/test_agent_floor.py runs the agent under it. Only where pyenv has a 3.8 (this image does).
  floor_py="${PYENV_ROOT:-$HOME/.pyenv}/versions/3.8.18/bin/python3.8"
  floor_venv="$HOME/.cache/edgeopt/agent-floor/py3.8"
  if [ -x "$floor_py" ] && [ "$(uname -m)" = x86_64 ] && ! "$floor_venv/bin/python" -c "import numpy" >/dev/null 2>&1; then
    rm -rf "$floor_venv"
    "$floor_py" -m venv --without-pip "$floor_venv" \
      && .venv/bin/python -m pip install -q --disable-pip-version-check --only-binary=:all: --no-deps \
           --python-version 3.8 --platform manylinux1_x86_64 --implementation cp --target \
           "$floor_venv/lib/python3.8/site-packages" numpy==1.17.4 \
      || { echo "agent floor venv (Python 3.8) not made: its test skips"; rm -rf "$floor_venv"; }
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
