#!/usr/bin/env bash
# GPU check for the vLLM generator: run on a machine with an NVIDIA GPU and PyPI access.
#
#   bash scripts/gpu_check.sh            # creates .venv-gpu, installs rlvr[vllm], runs the checks
#   VENV=/path/to/venv bash scripts/gpu_check.sh --dtype bfloat16
#
# It creates a separate venv (vLLM brings its own CUDA torch build; never mix it into the CPU
# venv), installs this checkout with the `vllm` extra (pinned in pyproject.toml), and runs
# scripts/gpu_check.py, which builds a tiny model in-process (no downloads) and checks:
#   1. greedy outputs of VLLMGenerator agree with HFGenerator on the same weights;
#   2. vLLM's sampler logprobs agree with the trainer's forward (score_tokens) within tolerance,
#      at temperature 1 and at temperature 0.7 (processed logprobs);
#   3. after update_weights(new weights) the outputs change to those of the new weights;
#   4. sleep / wake_up keeps the outputs (when --sleep is given);
#   and prints throughput (tokens/s) of both generators for 256 sequences x 32 new tokens.
# Results: benchmarks/results/gpu_check.json. Exit status 0 only if every check passes.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi >/dev/null 2>&1; then
    echo "gpu_check: no NVIDIA GPU visible (nvidia-smi failed); run this on a CUDA machine" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

VENV=${VENV:-.venv-gpu}
PYTHON=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --upgrade pip >/dev/null
# The vllm extra pins vllm (and through it a CUDA torch); installing it first lets pip keep
# vLLM's torch when it resolves rlvr's own `torch>=2.4`.
"$VENV/bin/python" -m pip install -e ".[vllm]"
"$VENV/bin/python" -c "import torch, vllm; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'vllm', vllm.__version__); assert torch.cuda.is_available()"
export RLVR_NUM_THREADS=${RLVR_NUM_THREADS:-4}
"$VENV/bin/python" scripts/gpu_check.py "$@"
