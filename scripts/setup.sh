#!/usr/bin/env bash
# Sets up a fresh machine: a virtual environment in .venv with torch (CPU build, installed first
# and pinned), then rlweave and its dependencies under constraints.txt so no CUDA torch is pulled.
# Usage: bash scripts/setup.sh [EXTRAS]     e.g. bash scripts/setup.sh dev,bench
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev}"
py="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$py" -m venv .venv
export PIP_DISABLE_PIP_VERSION_CHECK=1
.venv/bin/python -m pip install -q torch==2.13.0 2>&1 | grep -v "is ignored" || true
.venv/bin/python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
.venv/bin/python -m pip install -q -c constraints.txt -e ".[${extras}]" 2>&1 | grep -v "is ignored" || true
.venv/bin/python -c "import rlweave, torch, ray, mujoco; print('rlweave set up: torch', torch.__version__, 'ray', ray.__version__, 'mujoco', mujoco.__version__)"
