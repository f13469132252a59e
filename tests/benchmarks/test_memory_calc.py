"""benchmarks/memory.py: the calculator's bytes equal the bytes a real optimizer step holds (tiny Qwen2 on
CPU, the project's own build_optimizer), its counts equal the published checkpoints' sizes and the
LoRA formula, FSDP2's shard arithmetic equals torch.chunk's, and the script's main writes its tables."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO

ROOT = REPO
sys.path.insert(0, str(ROOT))
from benchmarks import memory  # noqa: E402
from rlvr.train.optimizer import build_optimizer  # noqa: E402

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
            vocab_size=128, max_position_embeddings=64)


def tiny_model(dtype: torch.dtype, tied: bool = False):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(**TINY, tie_word_embeddings=tied)).to(dtype)


def one_step(model, master_weights: str):
    """One forward + backward + optimizer step with build_optimizer; returns the optimizer."""
    opt, _ = build_optimizer(model, lr=1e-3, master_weights=master_weights)
    ids = torch.randint(0, TINY["vocab_size"], (2, 6), generator=torch.Generator().manual_seed(1))
    model(input_ids=ids).logits.float().sum().backward()
    opt.step()
    return opt


def held_bytes(model, opt) -> dict[str, int]:
    """What the process actually holds: parameters, .grad (and the float32 gradient sums an optimizer holds in
    their place), and the optimizer state split into the master copies and the rest (moments, step tensors)."""
    params = list(model.parameters())
    master = adam = 0
    for state in opt.state.values():
        for key, value in state.items():
            if torch.is_tensor(value):
                if key == "master":
                    master += value.nbytes
                else:
                    adam += value.nbytes
    summed = sum(g.nbytes for g in getattr(opt, "grads32", {}).values())  # MasterWeightAdamW's float32 gradients
    return dict(weights=sum(p.nbytes for p in params),
                grads=sum(p.grad.nbytes for p in params if p.grad is not None) + summed, master=master, adam=adam)


@pytest.mark.parametrize("dtype,master_weights", [("float32", "float32"), ("bfloat16", "float32"),
                                                  ("bfloat16", "same")])
@pytest.mark.parametrize("tied", [False, True])
def test_full_finetuning_bytes_equal_a_real_step(dtype, master_weights, tied):
    model = tiny_model(getattr(torch, dtype), tied)
    counts = memory.count_model("tiny", model, ranks=())
    assert counts.params == sum(p.numel() for p in model.parameters())
    opt = one_step(model, master_weights)
    held = held_bytes(model, opt)
    row = memory.learner_row(counts, gpus=1, dtype=dtype, master_weights=master_weights)
    assert dict(weights=row.weights, grads=row.grads, master=row.master, adam=row.adam) == held
    # the masters exist exactly when a bf16 model asks for them
    assert (held["master"] > 0) == (dtype == "bfloat16" and master_weights == "float32")


def test_reference_copy_bytes_equal_the_deep_copy():
    from rlvr.train.pg.reference import ReferencePolicy

    model = tiny_model(torch.bfloat16)
    ref = ReferencePolicy(model, enabled=True)
    row = memory.learner_row(memory.count_model("tiny", model, ranks=()), gpus=1, dtype="bfloat16")
    assert row.reference == sum(p.nbytes for p in ref.model.parameters())


def test_frozen_subset_counts_only_the_trainable_tensors():
    """A LoRA-like case without peft: everything frozen but the q/v projections."""
    model = tiny_model(torch.bfloat16)
    trainable = []
    for name, p in model.named_parameters():
        p.requires_grad_(name.endswith(("q_proj.weight", "v_proj.weight")))
        if p.requires_grad:
            trainable.append(tuple(p.shape))
    opt = one_step(model, "float32")
    held = held_bytes(model, opt)
    expected = memory.optimizer_bytes(trainable, "bfloat16", "float32")
    frozen = sum(p.nbytes for p in model.parameters() if not p.requires_grad)
    assert held == dict(expected, weights=expected["weights"] + frozen)


def test_lora_adapters_counted_and_their_bytes_equal_peft():
    peft = pytest.importorskip("peft")
    base = tiny_model(torch.bfloat16)
    counts = memory.count_model("tiny", base, ranks=(4,))
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=list(memory.LORA_TARGETS)))
    adapters = [p for p in model.parameters() if p.requires_grad]
    assert sorted(tuple(p.shape) for p in adapters) == sorted(counts.lora[4])  # lora_A (r, in), lora_B (out, r)
    adapter_dtype = str(adapters[0].dtype).removeprefix("torch.")
    opt = one_step(model, "float32")
    row = memory.learner_row(counts, lora_rank=4, gpus=1, dtype="bfloat16", adapter_dtype=adapter_dtype)
    assert dict(weights=row.weights, grads=row.grads, master=row.master, adam=row.adam) == held_bytes(model, opt)
    assert row.reference == 0


def test_lora_count_is_the_hand_formula():
    """r * (in + out) per targeted Linear, written out from the 0.5B shape: q/o 896 -> 896, k/v 896 -> 128
    (2 KV heads x 64), gate/up 896 -> 4864, down 4864 -> 896; 24 layers."""
    c = memory.count_model("0.5B", memory.meta_model(memory.SHAPES["Qwen2.5-0.5B"]), ranks=(8, 64))
    h, kv, i = 896, 2 * 64, 4864
    per_layer = 2 * (h + h) + 2 * (h + kv) + 3 * (h + i)
    for r in (8, 64):
        assert sum(map(memory.numel, c.lora[r])) == r * per_layer * 24
    assert len(c.lora[8]) == 2 * 7 * 24


def test_meta_counts_are_the_published_checkpoint_sizes():
    """Parameter counts of the released Qwen2.5 checkpoints (their model cards / safetensors index)."""
    published = {"Qwen2.5-0.5B": 494_032_768, "Qwen2.5-1.5B": 1_543_714_304, "Qwen2.5-7B": 7_615_616_512}
    for name, n in published.items():
        c = memory.count_model(name, memory.meta_model(memory.SHAPES[name]), ranks=())
        assert c.params == n
        assert c.root_params + c.layers * c.layer_params == n


def test_shard_share_is_torch_chunk_rank0():
    for shape in [(5, 3), (8, 4), (151936, 896), (7,), (1, 9)]:
        t = torch.empty(shape, device="meta")
        for n in (1, 2, 3, 8):
            chunk0 = torch.chunk(t, n, dim=0)[0].numel()
            assert memory.shard_numel(shape, n) == chunk0
    assert memory.shard_numel((5, 3), 2) == 9 and memory.shard_numel((5, 3), 8) == 3


def test_fsdp2_layout_is_float32_shards():
    """bf16 + fp32 masters under FSDP2: float32 sharded parameters (no separate master), float32 grads,
    float32 moments, a float32 sharded reference; on 2 ranks exactly half of each even-rowed tensor."""
    model = tiny_model(torch.bfloat16)
    c = memory.count_model("tiny", model, ranks=())
    one, two = memory.learner_row(c, gpus=1), memory.learner_row(c, gpus=2)
    half = sum(memory.shard_numel(s, 2) for s in c.shapes)
    assert (two.weights, two.grads, two.master, two.reference) == (4 * half, 4 * half, 0, 4 * half)
    assert two.adam == 8 * half + 4 * len(c.shapes)
    assert one.static == 18 * c.params and two.static == 16 * half + 4 * len(c.shapes)  # one GPU: float32 grad sums
    assert two.gathered == 2 * (c.root_params + 2 * c.layer_params) and one.gathered == 0


def test_activation_estimate_by_hand():
    c = memory.count_model("tiny", tiny_model(torch.float32), ranks=())
    # h 32, L 2, i 64, V 128, b 2: no checkpointing 2 * (192 + 256) * 2 + 4 * 128; checkpointing 2 * 32 * 2 +
    # (192 + 256) * 2 + 4 * 128
    assert memory.activation_bytes_per_token(c, checkpointing=False) == 2304
    assert memory.activation_bytes_per_token(c, checkpointing=True) == 1536


def test_main_writes_the_tables(tmp_path, capsys):
    assert memory.main(["--dry-run", "--out", str(tmp_path / "dry")]) == 0
    assert not (tmp_path / "dry").exists()
    assert memory.main(["--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "memory.json").read_text())
    text = (tmp_path / "memory.md").read_text()
    assert len(data["rows"]) == len(memory.SHAPES) * (1 + len(memory.LORA_RANKS)) * len(memory.GPU_COUNTS)
    for r in data["rows"]:
        assert r["static"] == r["weights"] + r["grads"] + r["master"] + r["adam"]
        assert f"**{r['static'] / memory.GIB:.2f}**" in text
    full7 = {r["gpus"]: r["static"] for r in data["rows"] if r["model"] == "Qwen2.5-7B" and r["method"] == "full"}
    assert full7[1] == 18 * 7_615_616_512 and full7[8] < full7[1] / 7.9
    assert "Qwen2.5-7B" in capsys.readouterr().out
    # the committed results are what the calculator computes now
    assert text == (ROOT / "benchmarks" / "results" / "memory.md").read_text(encoding="utf-8"), \
        "benchmarks/results/memory.md is stale: rerun python benchmarks/memory.py (and copy changed rows into the docs)"


def test_fits_adds_the_sampler_copy_on_rank0_of_fsdp2_only():
    result = memory.compute(shapes={"tiny": dict(TINY, tie_word_embeddings=False)}, ranks=(4,), budgets=(64,))
    params = result["models"][0]["params"]
    act = next(a["budgets"]["64"] for a in result["activations"] if a["checkpointing"])
    rows = {(r["method"], r["gpus"]): r for r in result["rows"]}
    for f in memory.fits(result, 64):
        r = rows[(f["method"], f["gpus"])]
        assert f["peak"] == r["static"] + r["gathered"] + act
        assert f["rank0"] - f["peak"] == (2 * params if f["gpus"] > 1 else 0)
        assert f["rank0_kl"] - f["rank0"] == r["reference"]


def doc_table_rows(page: Path) -> list[str]:
    """Table lines between `<!-- memory.md rows: begin -->` and `<!-- memory.md rows: end -->` markers."""
    rows, inside = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.strip() == "<!-- memory.md rows: begin -->":
            inside = True
        elif line.strip() == "<!-- memory.md rows: end -->":
            inside = False
        elif inside and line.startswith("|"):
            rows.append(line)
    return rows


def test_docs_tables_are_copies_of_the_results_file():
    results = set((ROOT / "benchmarks" / "results" / "memory.md").read_text(encoding="utf-8").splitlines())
    for page in ("docs/multi_gpu.md", "docs/benchmarks.md"):
        rows = doc_table_rows(ROOT / page)
        assert len(rows) > 10, page
        stale = [r for r in rows if r not in results]
        assert not stale, f"{page}: rows not in benchmarks/results/memory.md (rerun benchmarks/memory.py):\n" + \
            "\n".join(stale)
