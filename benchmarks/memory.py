"""Memory per GPU of the learner, computed (not measured): full fine-tuning vs LoRA, one GPU vs FSDP2.

    .venv/bin/python benchmarks/memory.py              # the table on stdout, benchmarks/results/memory.{md,json}
    .venv/bin/python benchmarks/memory.py --dry-run    # same table, nothing written
    .venv/bin/python benchmarks/memory.py --out DIR    # write memory.md / memory.json under DIR

Models: Qwen2.5-0.5B / 1.5B / 7B shapes (SHAPES), built on the meta device from transformers' Qwen2Config
(no memory, no download). Parameter counts and tensor shapes are read from that meta model; LoRA
adapters are counted on the Linear modules whose name ends in one of LORA_TARGETS: rank r adds
lora_A (r, in) and lora_B (out, r), r * (in + out) parameters per targeted Linear.

Bytes per element, as the code keeps them (rlvr/train/optimizer.py build_optimizer, rlvr/train/precision.py,
rlvr/train/pg/reference.py, rlvr/train/pg/sharded.py on the fsdp2 branch):

  1 GPU, model.dtype=bfloat16 model.master_weights=float32 (MasterWeightAdamW):
      weights 2, grads 4 (summed in float32 over the micro-batches), fp32 master 4, Adam exp_avg + exp_avg_sq 4 + 4
      (its step counter is a Python int: no tensor); KL reference (algo.kl_coef > 0): a deep copy, 2
  1 GPU, float32 (or master_weights=same): torch.optim.AdamW: weights b, grads b, moments 2b, plus its
      float32 step scalar: 4 bytes per parameter tensor (b = the dtype's bytes)
  FSDP2 over N ranks (distributed.learner=fsdp2), bf16 + fp32 masters: rlvr.train.pg.sharded.shard calls
      model.float() and shards with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): the sharded
      float32 parameters ARE the masters (weights 4, master 0), grads 4, torch AdamW moments 8 (+ step
      scalars); the reference is sharded the same way (float32, 4). Each tensor is split along dim 0 into
      N chunks of ceil(d0 / N) rows (FSDP2 pads), and the table gives rank 0's share: the largest.
  LoRA: the base is frozen (no grads, no optimizer state) in the model's dtype (bf16, 2) on one GPU; the
      adapters are trainable in --adapter-dtype (default float32, peft's autocast_adapter_dtype=True), so
      they take the float32 path above; no reference copy (the reference is the base with the adapter
      disabled). LoRA + FSDP2: shard() makes only the trained parameters float32 (the adapters), the frozen
      base stays in the model's dtype and is sharded (2 bytes / N for bf16).

Not sharded by FSDP2, so NOT divided by N (columns "gathered" and the activation table):
  - the gathered parameters: the root unit (embedding, final norm, LM head) stays gathered for the whole
    forward + backward, and about two decoder layers at a time (the running one and the prefetched one),
    in bf16. An estimate of the working set, not a bound;
  - activations (each rank runs its micro-batches of algo.micro_batch_tokens tokens);
  - on rank 0 only, the sampler: a full copy of the policy in the model dtype (2 bytes / parameter,
    rlvr.train.pg.sharded.generator_model: the hf sampler's module; with vLLM the rollout source still holds
    it), counted in the "fits" table; vLLM colocated also takes rollout.gpu_memory_utilization x the
    GPU's memory.

Activations per token (an ESTIMATE, the formula of docs/real_model.md "Memory"; b = 2 for bf16):
  without gradient checkpointing   layers x (6 h + 4 i) x b + 4 x vocab      (the logits and their gradient)
  with gradient checkpointing      layers x h x b + (6 h + 4 i) x b + 4 x vocab
  (h hidden size, i MLP width). The 6h + 4i factor is a rough count of the tensors one decoder layer
  saves for backward, not derived from the kernels; the script prints it next to the CPU measurement of
  benchmarks/real_model_memory.py (float32, b = 4, logits 8 x vocab) when that result file exists.

GiB = 2^30 bytes. Every number in the tables is computed here; none is typed in.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
GIB = float(1 << 30)

_COMMON = dict(max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6)
SHAPES: dict[str, dict] = {
    "Qwen2.5-0.5B": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True, **_COMMON),
    "Qwen2.5-1.5B": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True, **_COMMON),
    "Qwen2.5-7B": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False, **_COMMON),
}
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_RANKS = (8, 16, 64)
GPU_COUNTS = (1, 2, 8)
TOKEN_BUDGETS = (4096, 16384)
GPU_SIZES_GIB = (24, 80)
HEADROOM = 0.9  # a "fits" verdict leaves 10% of the card for the CUDA context, NCCL buffers and fragmentation
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
STEP_SCALAR_BYTES = 4  # torch.optim.AdamW's state["step"]: a float32 scalar tensor per parameter tensor


# ------------------------------------------------------------------------------------------ counting


def meta_model(shape: dict):
    """A Qwen2ForCausalLM with `shape` (Qwen2Config kwargs) on the meta device: shapes, no storage."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**shape)
    with torch.device("meta"):
        return Qwen2ForCausalLM(config)


def lora_linears(model, targets=LORA_TARGETS) -> list[tuple[str, int, int]]:
    """(name, in_features, out_features) of every nn.Linear whose last name component is in `targets`."""
    import torch

    return [(name, m.in_features, m.out_features) for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets]


def lora_shapes(model, rank: int, targets=LORA_TARGETS) -> list[tuple[int, ...]]:
    """The adapter tensors rank `rank` adds: lora_A (r, in) and lora_B (out, r) per targeted Linear."""
    out: list[tuple[int, ...]] = []
    for _, fan_in, fan_out in lora_linears(model, targets):
        out += [(rank, fan_in), (fan_out, rank)]
    return out


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def shard_numel(shape: tuple[int, ...], n: int) -> int:
    """Elements rank 0 holds of a tensor FSDP2 shards over n ranks: ceil(dim0 / n) rows (padded chunks)."""
    if n == 1 or not shape:
        return numel(shape)
    return math.ceil(shape[0] / n) * numel(shape[1:])


@dataclass
class Counts:
    """What the calculator needs from a model: every parameter tensor's shape (tied weights once), the
    decoder layers' and the root's parameter counts (FSDP2 units), the adapter shapes per rank."""

    name: str
    shapes: list[tuple[int, ...]]
    layer_params: int  # parameters of one decoder layer (all layers have the same shapes)
    root_params: int  # parameters outside the decoder layers: embedding, final norm, LM head if untied
    hidden: int
    layers: int
    intermediate: int
    vocab: int
    lora: dict[int, list[tuple[int, ...]]] = field(default_factory=dict)

    @property
    def params(self) -> int:
        return sum(map(numel, self.shapes))


def count_model(name: str, model, ranks=LORA_RANKS, targets=LORA_TARGETS) -> Counts:
    """Counts of `model` (meta or real); model.parameters() yields a tied embedding once."""
    c = model.config
    layer0 = model.model.layers[0]
    layer_params = sum(p.numel() for p in layer0.parameters())
    shapes = [tuple(p.shape) for p in model.parameters()]
    root = sum(map(numel, shapes)) - layer_params * c.num_hidden_layers
    return Counts(name, shapes, layer_params, root, c.hidden_size, c.num_hidden_layers, c.intermediate_size,
                  c.vocab_size, {r: lora_shapes(model, r, targets) for r in ranks})


# ------------------------------------------------------------------------------------------- bytes


def optimizer_bytes(shapes, dtype: str, master_weights: str, shards: int = 1) -> dict[str, int]:
    """Bytes (rank 0's share over `shards`) of trainable tensors `shapes` stored in `dtype`, with the optimizer
    build_optimizer makes for master_weights (float32 | same): weights, grads, master, adam."""
    b = DTYPE_BYTES[dtype]
    n = sum(shard_numel(s, shards) for s in shapes)
    if master_weights == "float32" and dtype != "float32":  # MasterWeightAdamW: step is a Python int
        return dict(weights=b * n, grads=4 * n, master=4 * n, adam=8 * n)  # its float32 gradient sums
    # torch.optim.AdamW: moments in the parameter's dtype, one float32 step scalar per tensor
    return dict(weights=b * n, grads=b * n, master=0, adam=2 * b * n + STEP_SCALAR_BYTES * len(shapes))


@dataclass
class Row:
    model: str
    method: str  # "full" or "LoRA r=R"
    gpus: int
    trainable: int
    weights: int
    grads: int
    master: int
    adam: int
    reference: int  # with algo.kl_coef > 0
    gathered: int  # FSDP2's gathered working set (estimate), 0 on one GPU

    @property
    def static(self) -> int:
        return self.weights + self.grads + self.master + self.adam

    @property
    def static_kl(self) -> int:
        return self.static + self.reference


def learner_row(c: Counts, *, lora_rank: int = 0, gpus: int = 1, dtype: str = "bfloat16",
                master_weights: str = "float32", adapter_dtype: str = "float32") -> Row:
    """Rank 0's static learner memory for full fine-tuning (lora_rank 0) or LoRA, on one GPU (the local
    learner) or FSDP2 over `gpus` ranks, with the layouts of the module docstring."""
    fsdp = gpus > 1
    bf16_masters = dtype != "float32" and master_weights == "float32"
    # FSDP2 with bf16 + fp32 masters keeps float32 sharded parameters (shard() calls model.float())
    stored = "float32" if fsdp and bf16_masters else dtype
    base = sum(shard_numel(s, gpus) for s in c.shapes)
    gathered = DTYPE_BYTES[dtype] * (c.root_params + 2 * c.layer_params) if fsdp else 0
    if lora_rank == 0:
        o = optimizer_bytes(c.shapes, stored, master_weights, gpus)
        return Row(c.name, "full", gpus, c.params, o["weights"], o["grads"], o["master"], o["adam"],
                   reference=DTYPE_BYTES[stored] * base, gathered=gathered)
    adapters = c.lora[lora_rank]
    a_dtype = "float32" if fsdp and bf16_masters else adapter_dtype
    o = optimizer_bytes(adapters, a_dtype, master_weights, gpus)
    frozen = DTYPE_BYTES[dtype] * base  # the frozen base keeps the model's dtype, sharded or not
    return Row(c.name, f"LoRA r={lora_rank}", gpus, sum(map(numel, adapters)), frozen + o["weights"], o["grads"],
               o["master"], o["adam"], reference=0, gathered=gathered)


def activation_bytes_per_token(c: Counts, *, checkpointing: bool, b: int = 2) -> int:
    """The module docstring's estimate: bytes of activations one token costs in forward + backward."""
    per_layer = (6 * c.hidden + 4 * c.intermediate) * b
    logits = 2 * b * c.vocab  # the logits and their gradient
    if checkpointing:
        return c.layers * c.hidden * b + per_layer + logits
    return c.layers * per_layer + logits


# ------------------------------------------------------------------------------------------- tables


def compute(shapes: dict[str, dict] | None = None, ranks=LORA_RANKS, gpu_counts=GPU_COUNTS,
            budgets=TOKEN_BUDGETS, adapter_dtype: str = "float32") -> dict:
    """Every table of the report as plain numbers (bytes), from meta models of `shapes`."""
    shapes = SHAPES if shapes is None else shapes
    models, rows, acts = [], [], []
    for name, shape in shapes.items():
        c = count_model(name, meta_model(shape), ranks)
        models.append(dict(model=name, params=c.params, tensors=len(c.shapes), layer_params=c.layer_params,
                           root_params=c.root_params, lora={str(r): sum(map(numel, s)) for r, s in c.lora.items()},
                           shape={k: v for k, v in shape.items() if k not in _COMMON}))
        for method in (0, *ranks):
            for g in gpu_counts:
                r = learner_row(c, lora_rank=method, gpus=g, adapter_dtype=adapter_dtype)
                rows.append(dict(vars(r), static=r.static, static_kl=r.static_kl))
        for ckpt in (False, True):
            per = activation_bytes_per_token(c, checkpointing=ckpt)
            acts.append(dict(model=name, checkpointing=ckpt, bytes_per_token=per,
                             budgets={str(t): per * t for t in budgets}))
    return dict(models=models, rows=rows, activations=acts, budgets=list(budgets), gpu_sizes_gib=list(GPU_SIZES_GIB),
                headroom=HEADROOM, adapter_dtype=adapter_dtype)


def fits(result: dict, budget: int) -> list[dict]:
    """Per row: the learner's peak estimate with gradient checkpointing and a `budget`-token micro-batch
    (static + gathered + activations; vLLM elsewhere or asleep), without and with the KL reference; rank 0
    of an FSDP2 run adds the sampler's full copy of the policy in bf16 (rlvr.train.pg.sharded.generator_model).
    A row fits a card when rank 0's peak is at most HEADROOM of it."""
    act = {a["model"]: a["budgets"][str(budget)] for a in result["activations"] if a["checkpointing"]}
    params = {m["model"]: m["params"] for m in result["models"]}
    out = []
    for r in result["rows"]:
        peak = r["static"] + r["gathered"] + act[r["model"]]
        peak_kl = r["static_kl"] + r["gathered"] + act[r["model"]]
        sampler = DTYPE_BYTES["bfloat16"] * params[r["model"]] if r["gpus"] > 1 else 0
        out.append(dict(model=r["model"], method=r["method"], gpus=r["gpus"], peak=peak, peak_kl=peak_kl,
                        rank0=peak + sampler, rank0_kl=peak_kl + sampler,
                        fits={str(s): [peak + sampler <= HEADROOM * s * GIB, peak_kl + sampler <= HEADROOM * s * GIB]
                              for s in GPU_SIZES_GIB}))
    return out


def formula_vs_measured(path: Path) -> list[dict]:
    """The activation estimate in float32 (b = 4) next to benchmarks/real_model_memory.py's CPU measurement
    (Qwen2.5-0.5B shape, score_tokens forward + backward, 'extra' RSS), when that result file exists."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    c = count_model("Qwen2.5-0.5B", meta_model(SHAPES["Qwen2.5-0.5B"]), ranks=())
    out = []
    for a in data.get("activations", []):
        rows, length = (int(x) for x in a["tokens"].split("x"))
        ckpt = a["variant"] == "checkpointing"
        est = activation_bytes_per_token(c, checkpointing=ckpt, b=4) * rows * length
        out.append(dict(tokens=a["tokens"], checkpointing=ckpt, estimate_gib=est / GIB,
                        measured_gib=a["extra_gb"]))
    return out


def _g(x: int | float) -> str:
    return f"{x / GIB:.2f}"


def render(result: dict, measured: list[dict]) -> str:
    lines = ["# Learner memory per GPU: full fine-tuning vs LoRA, 1 GPU vs FSDP2 (computed)", "",
             "Computed by `benchmarks/memory.py` from the models' real shapes (meta device), not measured: no GPU "
             "was available. GiB per GPU (rank 0, the largest share), model.dtype=bfloat16 "
             "model.master_weights=float32; 1 GPU = the local learner, 2 and 8 = distributed.learner=fsdp2. "
             f"LoRA adapters in {result['adapter_dtype']} on q/k/v/o/gate/up/down. The byte layouts are in the "
             "script's docstring and docs/multi_gpu.md.", "",
             "| model | parameters | tensors | one decoder layer | root (embedding, norm, head) | "
             + " | ".join(f"LoRA r={r}" for r in next(iter(result["models"]))["lora"]) + " |",
             "|---|---:|---:|---:|---:|" + "---:|" * len(next(iter(result["models"]))["lora"])]
    for m in result["models"]:
        lines.append(f"| {m['model']} | {m['params']:,} | {m['tensors']} | {m['layer_params']:,} | "
                     f"{m['root_params']:,} | " + " | ".join(f"{v:,}" for v in m["lora"].values()) + " |")
    lines += ["", "## Static memory (GiB per GPU)", "",
              "weights: 1 GPU bf16 (LoRA: the frozen base + the adapters); FSDP2: the float32 sharded parameters, "
              "which are the masters (so the master column is 0). reference: the KL reference copy "
              "(algo.kl_coef > 0; LoRA: none, the adapter is disabled). gathered: FSDP2's unsharded working set "
              "(root unit + two decoder layers in bf16, an estimate), not in the totals.", "",
              "| model | method | GPUs | trainable | weights | grads | fp32 master | Adam | reference (KL) | "
              "total static | total static with KL | gathered (FSDP2) |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['model']} | {r['method']} | {r['gpus']} | {r['trainable']:,} | {_g(r['weights'])} | "
                     f"{_g(r['grads'])} | {_g(r['master'])} | {_g(r['adam'])} | {_g(r['reference'])} | "
                     f"**{_g(r['static'])}** | {_g(r['static_kl'])} | {_g(r['gathered'])} |")
    budgets = result["budgets"]
    lines += ["", "## Activations per micro-batch (estimate, bf16, not sharded by FSDP2)", "",
              "Per token: without checkpointing layers x (6h + 4i) x 2 B + 4 B x vocab; with "
              "(model.gradient_checkpointing=true) layers x h x 2 B + (6h + 4i) x 2 B + 4 B x vocab. "
              "A micro-batch is algo.micro_batch_tokens tokens.", "",
              "| model | gradient checkpointing | MiB per token | "
              + " | ".join(f"{t:,} tokens (GiB)" for t in budgets) + " |",
              "|---|---|---:|" + "---:|" * len(budgets)]
    for a in result["activations"]:
        lines.append(f"| {a['model']} | {'yes' if a['checkpointing'] else 'no'} | "
                     f"{a['bytes_per_token'] / (1 << 20):.3f} | "
                     + " | ".join(_g(v) for v in a["budgets"].values()) + " |")
    if measured:
        lines += ["", "The estimate against a measurement: `benchmarks/real_model_memory.py` (CPU, float32, "
                  "Qwen2.5-0.5B shape, forward + backward of score_tokens, extra resident memory); the formula "
                  "with 4-byte elements:", "",
                  "| tokens | checkpointing | estimate GiB | measured GiB |", "|---|---|---:|---:|"]
        for m in measured:
            lines.append(f"| {m['tokens']} | {'yes' if m['checkpointing'] else 'no'} | {m['estimate_gib']:.2f} | "
                         f"{m['measured_gib']:.2f} |")
    budget = budgets[0]
    sizes = result["gpu_sizes_gib"]
    lines += ["", f"## What fits (estimate): static + gathered + activations of a {budget:,}-token micro-batch "
              "with checkpointing", "",
              f"A row fits a card when rank 0's sum is at most {result['headroom']:.0%} of its memory (the rest for "
              "the CUDA context, NCCL buffers and fragmentation). The learner alone: vLLM on another GPU or asleep "
              "(rollout.sleep_mode); colocated and awake it takes rollout.gpu_memory_utilization of the card on "
              "top. Rank 0 of an FSDP2 run also holds the sampler's full bf16 copy of the policy (2 B per "
              "parameter); the other ranks are the first column. Verdicts: yes (KL on too), without KL, no.", "",
              "| model | method | GPUs | peak GiB, KL off / on | rank 0 GiB, KL off / on | "
              + " | ".join(f"{s} GiB card" for s in sizes) + " |",
              "|---|---|---:|---:|---:|" + "---|" * len(sizes)]
    for f in fits(result, budget):
        verdict = []
        for s in sizes:
            plain, kl = f["fits"][str(s)]
            verdict.append("yes" if kl else ("without KL" if plain else "no"))
        lines.append(f"| {f['model']} | {f['method']} | {f['gpus']} | {_g(f['peak'])} / {_g(f['peak_kl'])} | "
                     f"{_g(f['rank0'])} / {_g(f['rank0_kl'])} | " + " | ".join(verdict) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="print the tables, write nothing")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for memory.md and memory.json")
    ap.add_argument("--adapter-dtype", default="float32", choices=sorted(DTYPE_BYTES),
                    help="the LoRA adapters' storage dtype (peft's default casts bf16 adapters to float32)")
    args = ap.parse_args(argv)
    result = compute(adapter_dtype=args.adapter_dtype)
    result["measured_activations"] = formula_vs_measured(RESULTS / "real_model_memory.json")
    text = render(result, result["measured_activations"])
    print(text)
    if not args.dry_run:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "memory.md").write_text(text)
        (args.out / "memory.json").write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out / 'memory.md'} and {args.out / 'memory.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
