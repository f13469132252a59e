"""LoRA through peft (model.lora_rank > 0): only the adapters train and hold optimizer state, the reference
is the same module with its adapter off, pushes carry the merged weights under the base model's names,
checkpoints hold the adapter (+ the base once) and load back merged.

Tiny models (hidden 32, one layer): every test here runs in seconds.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

pytest.importorskip("peft")

from rlvr.config import ConfigError, load_config  # noqa: E402
from rlvr.models import lora  # noqa: E402
from rlvr.models.export import push_tensors  # noqa: E402
from rlvr.rollout import HFGenerator, SamplingSpec  # noqa: E402
from rlvr.rollout.batch import rollouts_to_batch  # noqa: E402
from rlvr.runs.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from rlvr.train.batching import ForwardSpec  # noqa: E402
from rlvr.train.config import ModelConfig, TrainConfig  # noqa: E402
from rlvr.train.optimizer import build_optimizer, clip_and_step  # noqa: E402
from rlvr.train.pg.objective import batch_logprobs  # noqa: E402
from rlvr.train.pg.reference import ReferencePolicy  # noqa: E402
from rlvr.train.policy import build_policy, resolve_model_dir  # noqa: E402

SHAPE = dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
PROMPTS = ["12+7=", "3+45=", "60+1=", "8+8="]


def _policy(rank: int = 4, seed: int = 3, **kw):
    return build_policy("tiny", seed=seed, lora_rank=rank, **SHAPE, **kw)


def _batch(model, tok, seed: int = 11):
    gen = HFGenerator(model, tok)
    rollouts = gen.generate(PROMPTS, SamplingSpec(n=2, temperature=1.0, max_tokens=5, seed=seed))
    return rollouts_to_batch(rollouts, tok.pad_token_id)


def _logp(model, batch):
    return batch_logprobs(model, batch, micro_batch_size=8)


def _train_adapter(model, tok, steps: int = 3, lr: float = 5e-2):
    """A few optimizer steps of a likelihood loss on sampled text: the adapter's B leaves 0."""
    opt, sched = build_optimizer(model, lr=lr)
    batch = _batch(model, tok)
    model.train()
    for _ in range(steps):
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        loss = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, out.logits.shape[-1]),
                                                 batch.input_ids[:, 1:].reshape(-1))
        loss.backward()
        clip_and_step(model, opt, sched, grad_clip=1.0)
    return opt, batch


def _adapter_numel(model) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if ".lora_" in n)


# ------------------------------------------------------------------------------------------- config


def test_config_keys_are_validated_naming_the_key():
    assert ModelConfig().lora_rank == 0 and ModelConfig().lora_target_modules == "all-linear"
    with pytest.raises(ConfigError, match=r"model\.lora_rank"):
        ModelConfig(lora_rank=-1).validate()
    with pytest.raises(ConfigError, match=r"model\.lora_alpha"):
        ModelConfig(lora_rank=4, lora_alpha=0).validate()
    with pytest.raises(ConfigError, match=r"model\.lora_dropout=0\.1 .*model\.disable_dropout"):
        ModelConfig(lora_rank=4, lora_dropout=0.1).validate()
    ModelConfig(lora_rank=4, lora_dropout=0.1, disable_dropout=False).validate()
    with pytest.raises(ConfigError, match=r"model\.lora_target_modules"):
        ModelConfig(lora_rank=4, lora_target_modules="q_proj,,v_proj").validate()
    cfg = load_config(TrainConfig, None, ["model.lora_rank=8", "model.lora_alpha=32",
                                          "model.lora_target_modules=q_proj,v_proj"])
    assert (cfg.model.lora_rank, cfg.model.lora_alpha, cfg.model.lora_target_modules) == (8, 32, "q_proj,v_proj")


def test_missing_peft_is_a_config_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    with pytest.raises(ConfigError, match=r"model\.lora_rank=4 needs the peft package"):
        ModelConfig(lora_rank=4).validate()
    ModelConfig(lora_rank=0).validate()  # off: peft not needed


def test_unknown_target_module_names_the_key():
    with pytest.raises(ValueError, match=r"model\.lora_target_modules='nope_proj'"):
        _policy(lora_target_modules="nope_proj")


def test_wrapping_targets_every_projection_and_starts_at_the_base_model():
    base, tok = build_policy("tiny", seed=3, **SHAPE)
    model, _ = _policy()
    assert lora.is_lora(model) and not lora.is_lora(base)
    wrapped = {n.split(".")[-1] for n, _ in model.get_base_model().named_modules() if n.endswith(("_proj",))}
    assert wrapped == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert len(trainable) == 2 * 7  # A and B of 7 projections, one layer
    only_qv, _ = _policy(lora_target_modules="q_proj,v_proj")
    assert len([p for p in only_qv.parameters() if p.requires_grad]) == 4
    batch = _batch(base, tok)
    assert torch.equal(_logp(model, batch), _logp(base, batch))  # B = 0: the same function


# ------------------------------------------------------------------------------- optimizer, memory


def test_only_adapter_parameters_get_gradients_and_optimizer_state():
    model, tok = _policy(rank=4)
    opt, _ = _train_adapter(model, tok)
    adapter = _adapter_numel(model)
    # rank 4: A is (4, in), B is (out, 4) for each of the 7 projections of the layer
    expected = sum(4 * (m.in_features + m.out_features) for n, m in model.get_base_model().named_modules()
                   if n.endswith("_proj") and hasattr(m, "in_features"))
    assert adapter == expected > 0
    for n, p in model.named_parameters():
        if ".lora_" not in n:
            assert not p.requires_grad and p.grad is None, n
    state = [t for s in opt.state.values() for k, t in s.items() if k in ("exp_avg", "exp_avg_sq")]
    assert sum(t.numel() for t in state) == 2 * adapter
    assert any(float(p.detach().abs().max()) > 0 for n, p in model.named_parameters() if ".lora_B." in n)  # it trained

    full, ftok = build_policy("tiny", seed=3, **SHAPE)
    fopt, _ = _train_adapter(full, ftok, steps=1)
    bytes_lora = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values())
    bytes_full = sum(t.numel() * t.element_size() for s in fopt.state.values() for t in s.values())
    n_full = sum(p.numel() for p in full.parameters())
    assert bytes_full >= 2 * 4 * n_full  # Adam: two float32 moments of every weight
    assert bytes_lora < 2 * 4 * adapter + 8 * len(opt.state) + 1  # + one step counter per tensor
    assert bytes_lora < bytes_full / 3


def test_bfloat16_model_trains_float32_adapters():
    model, tok = _policy(dtype="bfloat16")
    adapters = [p for n, p in model.named_parameters() if p.requires_grad]
    assert adapters and {p.dtype for p in adapters} == {torch.float32}  # peft keeps adapters in float32
    opt, _ = build_optimizer(model, lr=1e-3, master_weights="float32")
    assert type(opt) is torch.optim.AdamW  # no bf16 trainable weight: no master copies needed


# ---------------------------------------------------------------------------------------- reference


def test_reference_is_the_policy_with_its_adapter_off():
    base, tok = build_policy("tiny", seed=3, **SHAPE)
    frozen = copy.deepcopy(base).eval()
    model, _ = _policy()
    _train_adapter(model, tok)
    ref = ReferencePolicy(model, enabled=True)
    assert ref.model is model  # no second copy
    batch = _batch(frozen, tok, seed=5)
    fwd = ForwardSpec(micro_batch=8)
    ref_lp = ref.logprobs(batch, fwd)
    want = batch_logprobs(frozen, batch, 8)
    mask = batch.response_mask.bool()
    assert torch.allclose(ref_lp[mask], want[mask], atol=1e-6)
    policy_lp = batch_logprobs(model, batch, 8)
    assert float((policy_lp - want)[mask].abs().max()) > 1e-3  # the adapter is on for the policy
    assert model.training  # the reference forward left the policy's mode as it was


def test_refreshing_a_lora_reference_is_refused():
    model, _ = _policy()
    with pytest.raises(ConfigError, match=r"algo\.ref_refresh_every=2 with model\.lora_rank"):
        ReferencePolicy(model, enabled=True, refresh_every=2)
    ReferencePolicy(model, enabled=False, refresh_every=2)  # no reference: nothing to refresh


# --------------------------------------------------------------------------------------------- push


def test_merged_push_to_a_separate_copy_gives_the_policys_logprobs():
    model, tok = _policy()
    _train_adapter(model, tok)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    copy_model, _ = build_policy("tiny", seed=99, **SHAPE)  # other weights: the push must replace them all
    gen = HFGenerator(copy_model, tok)
    pushed = push_tensors(model)
    assert isinstance(pushed, lora.LoraPush)
    names = [n for n, _ in pushed]
    assert names == [n for n, _ in copy_model.named_parameters()]
    gen.update_weights(push_tensors(model), version=3)
    assert gen.weight_version == 3
    batch = _batch(model, tok, seed=7)
    mask = batch.response_mask.bool()
    got, want = _logp(copy_model, batch), _logp(model, batch)
    assert torch.allclose(got[mask], want[mask], atol=1e-5)
    base_lp = _logp(build_policy("tiny", seed=3, **SHAPE)[0], batch)
    assert float((base_lp - want)[mask].abs().max()) > 1e-3  # the base alone would not do
    for n, p in model.named_parameters():  # the learner's module is untouched by the merge
        assert torch.equal(p, before[n]), n


def test_push_to_a_generator_sharing_the_module_copies_nothing():
    model, tok = _policy()
    gen = HFGenerator(model, tok)
    _train_adapter(model, tok)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    gen.update_weights(push_tensors(model), version=2)
    assert gen.weight_version == 2
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n


# ---------------------------------------------------------------------------------------- checkpoint


def test_checkpoint_holds_the_adapter_and_the_base_once(tmp_path):
    model, tok = _policy()
    opt, batch = _train_adapter(model, tok)
    ckpt = save_checkpoint(tmp_path, 3, model=model, tokenizer=tok, optimizer=opt, rng=False)
    save_checkpoint(tmp_path, 4, model=model, tokenizer=tok, rng=False)
    mdir = ckpt / "model"
    assert (mdir / "adapter_model.safetensors").exists() and (mdir / "adapter_config.json").exists()
    assert not (mdir / "model.safetensors").exists()
    assert (tmp_path / "base_model" / "config.json").exists()
    assert lora.base_dir_of(mdir) == str((tmp_path / "base_model").resolve())
    assert resolve_model_dir(tmp_path) == tmp_path / "checkpoints" / "step_000004" / "model"

    fresh, _ = _policy(seed=50)  # another base and a zero adapter: the checkpoint must replace both
    fopt, _ = build_optimizer(fresh, lr=5e-2)
    load_checkpoint(ckpt, model=fresh, optimizer=fopt)
    mine, theirs = dict(model.named_parameters()), dict(fresh.named_parameters())
    assert mine.keys() == theirs.keys()
    for n in mine:
        assert torch.equal(mine[n], theirs[n]), n
    a = [t for s in opt.state.values() for t in s.values()]
    b = [t for s in fopt.state.values() for t in s.values()]
    assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))

    plain, ptok = lora.load_merged(mdir)
    assert not lora.is_lora(plain)
    mask = batch.response_mask.bool()
    assert torch.allclose(_logp(plain, batch)[mask], _logp(model, batch)[mask], atol=1e-5)
    # model.init_from of the run: base + adapter merged, then (lora_rank > 0) a new zero adapter on top
    again, _ = build_policy("tiny", init_from=str(tmp_path), lora_rank=2, **SHAPE)
    assert lora.is_lora(again)
    assert torch.allclose(_logp(again, batch)[mask], _logp(model, batch)[mask], atol=1e-5)


def test_checkpoint_of_another_kind_is_refused(tmp_path):
    model, tok = _policy()
    save_checkpoint(tmp_path / "a", 1, model=model, tokenizer=tok, rng=False)
    plain, _ = build_policy("tiny", seed=3, **SHAPE)
    with pytest.raises(RuntimeError, match="model.lora_rank"):
        load_checkpoint(tmp_path / "a", model=plain)
    save_checkpoint(tmp_path / "b", 1, model=plain, tokenizer=tok, rng=False)
    with pytest.raises(RuntimeError, match="model.lora_rank"):
        load_checkpoint(tmp_path / "b", model=model)
    other_rank, _ = _policy(rank=8)
    with pytest.raises(RuntimeError):
        load_checkpoint(tmp_path / "a", model=other_rank)


def test_policy_from_config_reads_the_lora_keys():
    from rlvr.train.policy import no_new_adapter, policy_from_config

    m = dataclasses.replace(ModelConfig(), lora_rank=2, lora_alpha=4.0, lora_target_modules="q_proj", **SHAPE)
    model, _ = policy_from_config(m, seed=1)
    layer = model.get_base_model().model.layers[0].self_attn.q_proj
    assert layer.r["default"] == 2 and layer.scaling["default"] == 2.0  # alpha / rank
    assert not lora.is_lora(policy_from_config(no_new_adapter(m), seed=1)[0])


def test_a_generator_holding_its_own_copy_of_a_lora_model_takes_merged_pushes():
    """What a Ray generator actor holds: an unpickled copy of the LoRA learner; the pushes it receives are the
    merged tensors under base names (a plain dict, as RayPlacement ships them)."""
    model, tok = _policy()
    gen = HFGenerator(copy.deepcopy(model), tok)
    _train_adapter(model, tok)
    gen.update_weights(list(push_tensors(model)), version=1)
    assert not lora.is_lora(gen.model) and gen.weight_version == 1
    batch = _batch(model, tok, seed=9)
    mask = batch.response_mask.bool()
    assert torch.allclose(_logp(gen.model, batch)[mask], _logp(model, batch)[mask], atol=1e-5)
    ros = gen.generate(PROMPTS, SamplingSpec(n=1, temperature=1.0, max_tokens=3, seed=0))
    assert len(ros) == len(PROMPTS)
