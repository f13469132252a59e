#!/usr/bin/env bash
# Wheels that benchmarks/gpu.py's TRL stage needs on a GPU machine without network, downloaded here into
# .whl/ (git-ignored through .git/info/exclude, not .gitignore).
#
#   bash scripts/gpu_wheels.sh            # -> .whl/*.whl (about 2.5 MiB), for CPython 3.12 on x86_64 Linux
#
# On the GPU machine (python3 3.12 with torch, transformers 5.x, numpy, pandas, pyarrow, accelerate, xxhash,
# huggingface_hub 1.x, httpx already installed; no TRL, no datasets, maybe no requests):
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
#       && export PYTHONPATH=/tmp/site:.
#
# What and why (one version of each; never torch, transformers or numpy: the machine's own are used):
# - trl 1.16.0: the GRPOTrainer of the issue-27 measurement (needs transformers >= 4.56.2; 5.17 is fine);
# - datasets 4.8.5: TRL imports it at module level; 4.8.x, not 5.x, because 5.x needs huggingface_hub >= 1.31
#   and pyarrow >= 24 while transformers 5.17 pins huggingface_hub < 2.0 of an unknown 1.x (4.8.5: hub >= 0.25,
#   < 2.0; pyarrow >= 21);
# - dill, multiprocess: datasets' own (dill < 0.4.2, multiprocess < 0.70.20);
# - requests and its own dependencies (urllib3, idna, certifi, charset-normalizer): datasets imports requests at
#   module level, and huggingface_hub 1.x no longer brings it.
# rlvr itself needs none of them on benchmarks/gpu.py's path: math-verify (rlvr.rewards.symbolic) is imported
# lazily, only by the math graders; the benchmark scores with the `language` reward.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(
    trl==1.16.0
    datasets==4.8.5
    dill==0.4.0
    multiprocess==0.70.18
    requests==2.32.5
    urllib3==2.5.0
    idna==3.10
    certifi==2025.8.3
    charset-normalizer==3.4.3
)
PY=${PYTHON:-python3}
mkdir -p .whl
# .whl/ stays out of git without touching .gitignore (the device tool carries it: `carry: [".whl"]`)
if gitdir=$(git rev-parse --git-dir 2>/dev/null); then
    mkdir -p "$gitdir/info"
    grep -qxF '/.whl/' "$gitdir/info/exclude" 2>/dev/null || echo '/.whl/' >> "$gitdir/info/exclude"
fi
"$PY" -m pip download --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]}"
# one version of each: a wheel left in .whl/ by an earlier list would be installed too
for f in .whl/*.whl; do
    name=$(basename "$f" | cut -d- -f1 | tr '[:upper:]_' '[:lower:]-')
    keep=0
    for w in "${WHEELS[@]}"; do
        want=$(echo "${w%%==*}" | tr '[:upper:]_' '[:lower:]-')
        ver=${w##*==}
        if [ "$name" = "$want" ] && [[ "$(basename "$f")" == *-"$ver"-* ]]; then keep=1; fi
    done
    if [ $keep = 0 ]; then echo "gpu_wheels: removing $f (not in the list)"; rm -f "$f"; fi
done
du -ch .whl/*.whl | tail -1
ls .whl
