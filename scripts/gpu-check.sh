#!/usr/bin/env bash
# The CUDA paths of rlweave in under 8 minutes on one GPU, written to one JSON (default
# gpu-check.json; give another path as the first argument): NCCL weight sync, FSDP2 on CUDA,
# offload/onload when groups share a device, bench flow and bench grpo-vs-trl with their CUDA
# settings (scripts/gpu_check.py says what each check does). On a machine without a GPU it says so
# in one line and exits 0.
#   bash scripts/gpu-check.sh [OUT.json]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu-check.json}"
gpu_seen=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
  gpu_seen="$(nvidia-smi -L | head -1)"
fi
# a Python whose torch sees CUDA: $PYTHON, the project's .venv, then python3 on the PATH
py=""
for candidate in "${PYTHON:-}" .venv/bin/python python3; do
  [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 || continue
  if "$candidate" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    py="$candidate"; break
  fi
done
if [ -z "$py" ]; then
  if [ -z "$gpu_seen" ]; then
    echo "gpu-check: no GPU on this machine (nvidia-smi lists none and torch sees no CUDA device); nothing to check"
    exit 0
  fi
  echo "gpu-check: ${gpu_seen%% (UUID*} is present but no Python here has a CUDA build of torch (tried \$PYTHON, .venv/bin/python, python3)" >&2
  exit 1
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" RAY_ADDRESS=local
exec timeout 480 "$py" scripts/gpu_check.py --out "$out" --budget-s 465
