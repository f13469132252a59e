#!/usr/bin/env bash
# Numbers unchanged across a refactor (issue 39): a handful of 3-step runs at fixed seeds (the demo, GRPO, PPO
# with a separate critic, partial rollouts, an environment, sft, ei), each run's metrics (timings, memory and
# throughput columns dropped) and final weights reduced to one sha256 per run.
#   scripts/same_numbers.sh OUT_DIR            run them with this tree's rlvr (PYTHONPATH decides which tree)
#   diff OUT_A/sums.txt OUT_B/sums.txt         no output = bit-identical
#   REHASH=1 scripts/same_numbers.sh OUT_DIR   the sums again, of the runs already there
# About 4 minutes on 2 cores.
set -euo pipefail
out=$(realpath -m "$1"); mkdir -p "$out"; : > "$out/sums.txt"
PY=${PY:-python}
export RLVR_NUM_THREADS=1 RLVR_PROGRESS=off
TINY=(model.hidden_size=32 model.num_layers=1 model.num_heads=2 model.intermediate_size=64 data.digits=1
      data.num_train=40 data.num_eval=4 sampling.max_tokens=6 run.steps=3 run.eval_every=0)
RL=(sampling.n_prompts=2 sampling.group_size=4)
run() {  # name, out key, command...
  local name=$1 key=$2; shift 2
  if [ "${REHASH:-0}" != 1 ]; then
    rm -rf "$out/$name"
    "$PY" -m rlvr.cli "$@" "$key=$out/$name" > "$out/$name.log" 2>&1 || { echo "$name failed: $out/$name.log"; tail -5 "$out/$name.log"; exit 1; }
  fi
  "$PY" - "$out/$name" "$name" >> "$out/sums.txt" <<'PYEOF'
import hashlib, json, sys
from pathlib import Path
import torch
root, name = Path(sys.argv[1]), sys.argv[2]
noisy = ("time", "sec", "/s", "tok_s", "mem", "mfu", "flops", "rss", "elapsed", "eta", "wall", "throughput", "per_s", "path", "dir")
h, parts = hashlib.sha256(), []
def clean(row):
    return {k: (clean(v) if isinstance(v, dict) else v) for k, v in sorted(row.items()) if not any(n in k for n in noisy)}
for m in sorted(root.rglob("metrics.jsonl")) + sorted(root.rglob("demo.json")):
    text = m.read_text()
    rows = [json.loads(x) for x in text.splitlines()] if m.suffix == ".jsonl" else [json.loads(text)]
    for row in rows:
        h.update(json.dumps(clean(row)).encode())
    parts.append(f"{m.relative_to(root)}:{len(rows)}")
for run in sorted({p.parent for p in root.rglob("metrics.jsonl")}):
    steps = sorted((run / "checkpoints").glob("step_*"))
    if not steps:
        continue
    from safetensors.torch import load_file
    last = steps[-1]
    tensors = {f"model.{k}": v for k, v in load_file(last / "model" / "model.safetensors").items()}
    if (last / "optimizer.pt").exists():
        def walk(prefix, v):
            if torch.is_tensor(v):
                tensors[prefix] = v
            elif isinstance(v, dict):
                for k in v:
                    walk(f"{prefix}.{k}", v[k])
            elif isinstance(v, (list, tuple)):
                for i, x in enumerate(v):
                    walk(f"{prefix}.{i}", x)
        walk("optimizer", torch.load(last / "optimizer.pt", map_location="cpu", weights_only=False))
    for k in sorted(tensors):
        h.update(k.encode()); h.update(tensors[k].detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    parts.append(f"{last.relative_to(root)}:{len(tensors)}t")
print(f"{name} {h.hexdigest()[:16]} {' '.join(parts)}")
PYEOF
}
run demo out_dir demo seed=0 num_train=400 sft_examples=200 num_eval=16 sft_steps=20 sft_eval_every=10 \
    rl_steps=3 n_prompts=8 group_size=4 progress=false
run grpo run.out_dir train --recipe grpo "${TINY[@]}" "${RL[@]}"
run ppo run.out_dir train --recipe ppo "${TINY[@]}" "${RL[@]}" algo.critic=separate
run partial run.out_dir train --recipe grpo "${TINY[@]}" "${RL[@]}" distributed.segment_tokens=3
run env run.out_dir train --recipe grpo "${TINY[@]}" "${RL[@]}" data.env=calculator data.env_max_turns=2 data.env_max_tokens=12
run sft run.out_dir sft "${TINY[@]}"
run ei run.out_dir ei "${TINY[@]}"
cat "$out/sums.txt"
