#!/usr/bin/env bash
# GPU check of the real trainer with vLLM rollouts: one command, no network once installed.
#
#   bash scripts/gpu_check.sh                  # NVIDIA GPU: creates .venv-gpu with rlvr[vllm] if needed, runs it
#   bash scripts/gpu_check.sh --backend hf     # same on the GPU without vLLM (transformers sampler)
#   bash scripts/gpu_check.sh --dry-run        # CPU: tiny shape, hf backend, the same pipeline (uses .venv)
#   bash scripts/gpu_check.sh --ray            # the Ray placement: vLLM generator actor, object-store weight
#                                              # push, sync and max_staleness=1 (scripts/gpu_check_ray.py;
#                                              # installs rlvr[vllm,ray]; --ray --dry-run: CPU, hf backend)
#
# What it runs (scripts/gpu_check.py, whose docstring has the details): builds a random-init Qwen2 model of
# the Qwen2.5-0.5B shape, a byte-level BPE tokenizer trained on the spot and a GSM8K-like JSONL, all on
# local disk; runs `rlvr train rollout.backend=vllm` for a few steps with rollout.sleep_mode=true and again
# with false; drives VLLMGenerator directly on the same prompts; prints and writes
# benchmarks/results/gpu.md (+ .json): sampler vs trainer logprobs at step 1 and after weight pushes, the
# push counterfactual, rollout tokens/s inside the trainer vs bare vLLM, learner tokens/s and MFU (against
# the H200's 989 TFLOP/s bf16 dense), peak GPU memory with and without sleep mode. About 6 minutes on one
# H200 after the install (an estimate: not run on a GPU yet; the first vLLM start also compiles CUDA graphs).
# With --backend hf: no sleep-mode rerun (the transformers sampler has none), 3 + 2 steps, no end-of-run eval
# (--eval to add it), the bare stage in the same process: about 4 minutes on one H200 (estimate from issue 27's
# 17 s per step).
# Exit status 0 only if every check passes.
#
# Environment: VENV (default .venv-gpu; .venv with --dry-run; VENV=system: no venv and no install, $PYTHON or
# python3 as it is with this checkout on PYTHONPATH, e.g. a GPU machine without network:
# `VENV=system bash scripts/gpu_check.sh --backend hf`), PYTHON (interpreter that creates the venv,
# default python3; vLLM 0.32 needs 3.11 to 3.14), WHEELHOUSE (a folder of wheels: install from it with
# --no-index, for machines without PyPI), RLVR_GPU_REINSTALL=1 (reinstall even if the venv looks ready).
# Any other argument goes to scripts/gpu_check.py (--steps 4, --keep-work, --work DIR, --out FILE, ...).
#
#   bash scripts/gpu_check.sh --bench          # THE GPU check for a 15-minute device slot (issue 38): no venv, no
#                                              # network, this machine's python3 (torch, transformers); TRL from
#                                              # .whl/ when present (bash scripts/gpu_wheels.sh, carried along)
#   bash scripts/gpu_check.sh --bench --dry-run   # the same on CPU (.venv), tiny shape: the pipeline check
#
# --bench runs benchmarks/gpu.py --profile --budget-s ${RLVR_GPU_BUDGET_S:-420} under `timeout` (TERM at
# ${RLVR_GPU_TIMEOUT_S:-470} s, KILL 20 s later; the script writes its report on TERM), with --out-dir "$OUT" when OUT
# is set; any other argument goes to benchmarks/gpu.py (--quick, --skip trl, --variant NAME:key=value, ...). It
# prints one table (the plain, LoRA, fsdp2 and fsdp2+LoRA rows, a warm second process, TRL, the bare
# forward+backward), the targets next to the measurements and the correctness checks, and writes
# benchmarks/results/gpu_bench.{md,json} (+ gpu_profile.txt), then times one sampling step before and now
# (benchmarks/sampler.py: results/sampler_cuda.{md,json}). Exit status 0 only when every stage ran and every
# check passed. Environment: PYTHON (default python3; .venv/bin/python with --dry-run), RLVR_WHEEL_SITE (where the
# wheels are installed, default /tmp/rlvr-gpu-site).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = --bench ]; then
    shift
    dry=0
    for arg in "$@"; do [ "$arg" = --dry-run ] && dry=1; done
    if [ $dry = 1 ]; then
        PY=${PYTHON:-.venv/bin/python}
    else
        PY=${PYTHON:-python3}
        if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi >/dev/null 2>&1; then
            echo "gpu_check: no NVIDIA GPU visible (nvidia-smi failed); use --bench --dry-run to check the pipeline on CPU" >&2
            exit 2
        fi
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    fi
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    if [ $dry = 0 ] && compgen -G ".whl/*.whl" >/dev/null; then
        # TRL and what it imports that the machine lacks (scripts/gpu_wheels.sh): never torch or transformers
        site=${RLVR_WHEEL_SITE:-/tmp/rlvr-gpu-site}
        if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl; then
            export PYTHONPATH="$PWD:$site${PYTHONPATH#"$PWD"}"
        else
            echo "gpu_check: installing .whl/*.whl failed; the TRL stage will be skipped" >&2
        fi
    fi
    "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'CUDA', torch.version.cuda, \
'transformers', transformers.__version__)"
    out_args=()
    if [ -n "${OUT:-}" ]; then out_args=(--out-dir "$OUT"); fi
    budget=${RLVR_GPU_BUDGET_S:-420}
    hard=${RLVR_GPU_TIMEOUT_S:-470}
    if [ $dry = 1 ]; then budget=${RLVR_GPU_BUDGET_S:-0}; hard=${RLVR_GPU_TIMEOUT_S:-600}; fi
    rc=0
    timeout -k 20 "$hard" "$PY" benchmarks/gpu.py --profile --budget-s "$budget" ${out_args[@]+"${out_args[@]}"} "$@" \
        || rc=$?
    if [ $rc = 124 ] || [ $rc = 137 ]; then
        echo "gpu_check: benchmarks/gpu.py was stopped at ${hard} s; the report it wrote so far is above" \
             "(and in benchmarks/results/gpu_bench.md on a GPU)" >&2
    fi
    # one sampling step before and now, and fused in the graph (benchmarks/sampler.py --fused, S4: ~10 s on a GPU and
    # the fused side's compile; a tiny vocabulary on the dry run; its table rewritten after each row)
    # (the dry run writes its table to a temporary folder, never over the measured one in benchmarks/results/)
    if [ $dry = 1 ]; then
        sargs=(--rows 2 --vocab 3000 --repeats 1 --fused --out-dir "${OUT:-$(mktemp -d)}")
    else
        sargs=(--device cuda --rows 64,512 --fused ${OUT:+--out-dir "$OUT"})
    fi
    src=0
    timeout -k 5 90 "$PY" benchmarks/sampler.py "${sargs[@]}" || src=$?
    if [ $rc = 0 ]; then rc=$src; fi
    exit $rc
fi

backend=vllm
device=cuda
script=scripts/gpu_check.py
args=()
prev=""
for arg in "$@"; do
    if [ "$arg" = --ray ]; then script=scripts/gpu_check_ray.py; prev=$arg; continue; fi
    args+=("$arg")
    case "$prev" in
        --backend) backend=$arg ;;
        --device) device=$arg ;;
    esac
    case "$arg" in
        --dry-run) backend=hf; device=cpu ;;
        --backend=*) backend=${arg#--backend=} ;;
        --device=*) device=${arg#--device=} ;;
    esac
    prev=$arg
done

if [ "$device" = cpu ]; then
    VENV=${VENV:-.venv}
    if ! "$VENV/bin/python" -c "import rlvr, torch, tokenizers" >/dev/null 2>&1; then
        echo "gpu_check: $VENV has no rlvr; run 'make test' once (it creates .venv), or set VENV" >&2
        exit 2
    fi
else
    if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi >/dev/null 2>&1; then
        echo "gpu_check: no NVIDIA GPU visible (nvidia-smi failed); use --dry-run to check the pipeline on CPU" >&2
        exit 2
    fi
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    if [ "${VENV:-}" = system ]; then
        # a machine with torch, transformers and tokenizers installed but no network: no venv, no install;
        # this checkout's rlvr from PYTHONPATH
        PY=${PYTHON:-python3}
        export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
        if ! "$PY" -c "import rlvr, torch, tokenizers, transformers" >/dev/null 2>&1; then
            echo "gpu_check: VENV=system: $PY cannot import rlvr, torch, tokenizers and transformers" >&2
            exit 2
        fi
        if [ "$backend" = vllm ] && ! "$PY" -c "import vllm" >/dev/null 2>&1; then
            echo "gpu_check: VENV=system: $PY has no vllm; use --backend hf" >&2
            exit 2
        fi
        "$PY" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda); \
assert torch.cuda.is_available(), 'torch does not see the GPU'"
        exec "$PY" "$script" ${args[@]+"${args[@]}"}
    fi
    VENV=${VENV:-.venv-gpu}
    PYTHON=${PYTHON:-python3}
    extra=""
    probe="import rlvr, torch, tokenizers"
    if [ "$script" = scripts/gpu_check_ray.py ]; then
        probe="$probe, ray"
        extra="[ray]"
    fi
    if [ "$backend" = vllm ]; then
        extra="[vllm]"
        if [ "$script" = scripts/gpu_check_ray.py ]; then extra="[vllm,ray]"; fi
        # the venv is ready when it holds the vllm version pyproject.toml pins
        pinned=$(sed -n 's/^vllm = \["vllm==\([^"]*\)".*/\1/p' pyproject.toml)
        probe="$probe; import importlib.metadata as m; assert m.version('vllm') == '$pinned', m.version('vllm')"
    fi
    if [ "${RLVR_GPU_REINSTALL:-0}" = 1 ] || ! "$VENV/bin/python" -c "$probe" >/dev/null 2>&1; then
        # its own venv: vLLM brings its own CUDA torch (torch==2.13.0, a CUDA build, for vllm 0.32.0); never mix it
        # into the CPU venv, whose torch is the 2.13.0 CPU build
        [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
        pip_flags=(--disable-pip-version-check)
        if [ -n "${WHEELHOUSE:-}" ]; then
            pip_flags+=(--no-index --find-links "$WHEELHOUSE")
        else
            "$VENV/bin/python" -m pip install "${pip_flags[@]}" -q --upgrade pip
        fi
        echo "gpu_check: installing rlvr$extra into $VENV (once; minutes: vLLM and a CUDA torch are large)"
        "$VENV/bin/python" -m pip install "${pip_flags[@]}" -e ".$extra"
    fi
    "$VENV/bin/python" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda); \
assert torch.cuda.is_available(), 'torch in $VENV does not see the GPU'"
fi
exec "$VENV/bin/python" "$script" ${args[@]+"${args[@]}"}
