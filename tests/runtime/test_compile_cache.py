"""torch.compile's caches across processes (issue 38, item 3: the first step of a second run of the same shape
starts from warm compile caches). rlvr.runtime.use_compile_cache runs before each compile of the package and
puts inductor's FX-graph and AOTAutograd caches under ~/.cache/rlvr/torch_compile (RLVR_COMPILE_CACHE), not
torch's /tmp default, unless the user chose TORCHINDUCTOR_CACHE_DIR."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO

import rlvr.algo.logprobs as logprobs
import rlvr.models.packed as packed
from rlvr.runtime import compile_cache_dir, use_compile_cache

ROOT = REPO


def test_the_cache_folder_is_the_users_cache_not_tmp(monkeypatch, tmp_path):
    monkeypatch.delenv("RLVR_COMPILE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache_dir() == tmp_path / "xdg" / "rlvr" / "torch_compile"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compile_cache_dir() == tmp_path / "home" / ".cache" / "rlvr" / "torch_compile"
    monkeypatch.setenv("RLVR_COMPILE_CACHE", str(tmp_path / "mine"))
    assert compile_cache_dir() == tmp_path / "mine"
    monkeypatch.setenv("RLVR_COMPILE_CACHE", "off")
    assert compile_cache_dir() is None


def test_torchs_tmp_default_is_replaced_and_the_users_choice_kept(monkeypatch, tmp_path):
    import torch._inductor.config as inductor_config
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("RLVR_COMPILE_CACHE", str(tmp_path / "rlvr"))
    # torch writes its /tmp default into the environment the first time it asks: not a choice of the user's
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    # (the config's own patch, not monkeypatch: undoing a setattr on torch's config module deletes the option, and
    # every later compile in the process then fails on "torch._inductor.config.fx_graph_cache does not exist")
    with inductor_config.patch(fx_graph_cache=False):
        assert use_compile_cache() == tmp_path / "rlvr"
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "rlvr")
        assert inductor_config.fx_graph_cache is True
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "users"))
    assert use_compile_cache() == tmp_path / "users"
    monkeypatch.setenv("RLVR_COMPILE_CACHE", "off")
    assert use_compile_cache() is None and os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "users")


def test_every_compile_of_the_package_asks_for_the_cache_first(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: calls.append("compile") or fn)
    for module in (logprobs, packed):
        monkeypatch.setattr(module, "use_compile_cache", lambda: calls.append("cache"))
    monkeypatch.setattr(logprobs._Fused, "compiled", None)
    monkeypatch.setattr(logprobs._Fused, "broken", False)
    logprobs._Fused.get("forward", torch.device("cuda"))  # the fused logprobs compile for CUDA logits
    assert calls == ["cache", "compile", "compile"]
    calls.clear()
    packed._compiled_flex.__wrapped__()  # the packed learner's flex attention
    assert calls == ["cache", "compile"]


CHILD = """
import json, torch
from torch._dynamo.utils import counters
from rlvr.runtime import use_compile_cache
folder = use_compile_cache()
f = torch.compile(lambda x, y: torch.nn.functional.gelu(x @ y).logsumexp(-1), dynamic=True)
f(torch.randn(8, 16), torch.randn(16, 4))
print(json.dumps({"folder": str(folder), "hit": counters["inductor"]["fxgraph_cache_hit"],
                  "miss": counters["inductor"]["fxgraph_cache_miss"]}))
"""


@pytest.mark.scale
def test_a_second_process_compiles_from_the_first_ones_cache(tmp_path):
    """Two processes with torch's defaults otherwise (no TORCHINDUCTOR_CACHE_DIR): the second one's inductor
    graph is a cache hit under ~/.cache/rlvr (XDG_CACHE_HOME here), none is left in torch's /tmp default
    (about 1 min on 2 cores: the first process compiles C++ with inductor)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR", "RLVR_COMPILE"))}
    env.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), PYTHONPATH=str(ROOT))
    runs = [json.loads(subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                                      timeout=600, check=True).stdout.strip().splitlines()[-1]) for _ in range(2)]
    folder = str(tmp_path / "xdg" / "rlvr" / "torch_compile")
    assert [r["folder"] for r in runs] == [folder, folder]
    assert (runs[0]["hit"], runs[0]["miss"]) == (0, 1) and (runs[1]["hit"], runs[1]["miss"]) == (1, 0)
    assert (Path(folder) / "fxgraph").is_dir()
