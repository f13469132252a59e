"""model.name / load_policy: clear errors for wrong local paths, hub ids still reach transformers,
and attn_implementation reaches from_pretrained. Nothing here touches the network."""

import pytest

from rlvr.models import build_tiny_model, load_policy, load_tokenizer, save_policy
from rlvr.models.loading import model_source
from rlvr.train.policy import build_policy

SMALL = dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


@pytest.fixture()
def model_dir(tmp_path):
    model, tok = build_tiny_model(**SMALL)
    return save_policy(model, tok, tmp_path / "policy")


def test_existing_folder_without_config_json(tmp_path):
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "tokenizer.json").write_text("{}")
    msg = f"not a Hugging Face model folder: {tmp_path / 'weights'} (no config.json)"
    for call in (load_policy, load_tokenizer, lambda p: build_policy(str(p))):
        with pytest.raises(FileNotFoundError) as err:
            call(tmp_path / "weights")
        assert str(err.value) == msg


def test_existing_file_is_not_a_model_folder(tmp_path):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="not a Hugging Face model folder: .*model.safetensors \\(no config.json\\)"):
        load_policy(str(f))


@pytest.mark.parametrize(
    "name",
    ["/no/such/dir", "./no_such_dir", "../no_such_dir", "~/no_such_dir_rlvr", "runs/sft/model", "C:\\models\\x",
     "bad name/with space", ".hidden_missing"],
)
def test_missing_local_looking_paths(name):
    with pytest.raises(FileNotFoundError) as err:
        build_policy(name, **SMALL)
    assert str(err.value) == f"model.name={name}: no such folder, and not a hub id (org/name)"


@pytest.mark.parametrize("name", ["Qwen/Qwen2.5-Math-1.5B", "Qwen/Qwen3-0.6B", "gpt2", "org-1/name_2.v3"])
def test_hub_ids_are_left_to_the_hub(name):
    assert model_source(name) == "hub"


def test_local_folder_is_local(model_dir):
    assert model_source(model_dir) == "local"
    assert model_source(str(model_dir)) == "local"


def test_hub_id_goes_to_from_pretrained_with_attn_implementation(monkeypatch, model_dir):
    # Stand-ins for the three transformers calls, so no network: record what they were asked.
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    seen = {}
    real_tok = load_tokenizer(model_dir)
    real_cfg = AutoConfig.from_pretrained(str(model_dir))

    def fake_tok(name, **kw):
        seen["tokenizer"] = name
        return real_tok

    def fake_cfg(name, **kw):
        seen["config"] = name
        return real_cfg

    def fake_model(name, **kw):
        seen["model"] = name
        seen["attn"] = kw.get("attn_implementation")
        return transformers.Qwen2ForCausalLM.from_pretrained(str(model_dir), **kw)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake_tok)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", fake_cfg)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_model)
    assert AutoTokenizer.from_pretrained is fake_tok and AutoModelForCausalLM.from_pretrained is fake_model

    model, _ = load_policy("Qwen/Qwen2.5-Math-1.5B")
    assert seen == {"tokenizer": "Qwen/Qwen2.5-Math-1.5B", "config": "Qwen/Qwen2.5-Math-1.5B",
                    "model": "Qwen/Qwen2.5-Math-1.5B", "attn": "sdpa"}  # auto: Qwen2 supports SDPA
    assert model.config._attn_implementation == "sdpa"
    load_policy("Qwen/Qwen2.5-Math-1.5B", attn_implementation="eager")
    assert seen["attn"] == "eager"


@pytest.mark.parametrize("attn", ["eager", "sdpa", "auto", None])
def test_local_folder_attn_implementation(model_dir, attn):
    model, _ = load_policy(model_dir, attn_implementation=attn)
    assert model.config._attn_implementation == ("sdpa" if attn in ("auto", None) else attn)


def test_build_policy_real_folder_with_checkpointing_and_attention(model_dir):
    model, _ = build_policy(str(model_dir), attn_implementation="eager", gradient_checkpointing=True)
    assert model.training and model.config.use_cache is False
    assert model.config._attn_implementation == "eager"
    assert all(layer.gradient_checkpointing for layer in model.model.layers)


def test_unknown_attn_implementation_in_load_policy(model_dir):
    with pytest.raises(ValueError, match="model.attn_implementation='flashy'"):
        load_policy(model_dir, attn_implementation="flashy")
