"""vLLM generator: the only module that imports vllm (lazily, inside VLLMGenerator).

Targets the version pinned in pyproject's `vllm` extra (vllm==0.34.0, V1 engine). What it relies on:
- `LLM(..., logprobs_mode="processed_logprobs")` (vLLM >= 0.10.2): returned logprobs are those
  of the distribution actually sampled from (after temperature, top-k, top-p), the same
  definition as HFGenerator (docs/models.md). Older versions fall back to raw logprobs.
- Prompts are passed as token ids (`TokensPrompt`), tokenized by our tokenizer exactly as
  HFGenerator does, so Rollout.prompt_ids agree between backends.
- Reproducibility: with spec.seed set, sample j of prompt i is its own request (n=1) with seed
  sequence_seed(seed, i, j), so the result does not depend on how vLLM batches requests. Prefix
  caching makes the repeated prompt cheap. (vLLM's RNG differs from ours: the same seed gives
  different samples in HFGenerator and VLLMGenerator, only their distributions agree.)
- Weight updates, in-process (the default: VLLM_ENABLE_V1_MULTIPROCESSING=0 is set before the
  engine starts, as TRL's colocate mode does): the vLLM model's `load_weights` is called with
  the trainer's (HF-named) tensors, then the prefix cache is reset so no KV computed with old
  weights is reused. When the engine runs in another process, the same call goes through
  `collective_rpc` with CPU copies (slower; tensor parallel > 1 is not supported here).
- Colocation: sleep(level) / wake_up() free and restore GPU memory between rollout phases
  (needs enable_sleep_mode=True). update_weights() on a sleeping engine wakes only its weights
  (tag "weights"); generate() wakes the KV cache (tag "kv_cache"), as TRL's colocate mode does.
Text: vLLM's own detokenizer is used only for stop-string detection; Rollout.text is rebuilt
from the token ids with our tokenizer (same cut rule as HFGenerator), so a tokenizer that vLLM
loads differently (the Qwen2 tokenizer trap of character tokenizers) cannot change the text.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import torch

from rlvr.rollout.hf_generator import find_completed_stop
from rlvr.rollout.types import Rollout, SamplingSpec, resolve_prompt_ids, sequence_seed


def _load_weights_on_worker(worker, weights):  # runs inside a vLLM worker via collective_rpc
    worker.model_runner.model.load_weights(weights=weights)
    return True


class VLLMGenerator:
    """Generator backed by `vllm.LLM` on a GPU.

    model_path: a local folder (save_policy output) or hub name. tokenizer: our tokenizer for
    that model (default: rlvr.models.load_tokenizer(model_path)). dtype: "bfloat16" | "float16" |
    "float32". gpu_memory_utilization: fraction of GPU memory vLLM may take (leave room for the
    trainer when colocated). in_process: run the engine core in this process so weights can be
    loaded without copies. Extra keyword arguments go to vllm.LLM.
    """

    def __init__(
        self,
        model_path: str,
        *,
        tokenizer=None,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.3,
        max_model_len: int | None = None,
        enable_sleep_mode: bool = False,
        enable_prefix_caching: bool = True,
        enforce_eager: bool = False,
        tensor_parallel_size: int = 1,
        device: str | None = None,
        in_process: bool = True,
        seed: int = 0,
        **llm_kwargs,
    ):
        # device = "cuda:N" puts the engine on its own GPU (not the learner's): the engine core
        # then runs in a child process that sees only that GPU (CUDA_VISIBLE_DEVICES set while it
        # starts), and weights travel through collective_rpc as CPU copies.
        if device is not None:
            in_process = False
        if in_process and tensor_parallel_size == 1:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
            # collective_rpc ships our weight-loading function to the workers by pickling
            os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        try:
            import vllm
        except ImportError as exc:
            raise ImportError("VLLMGenerator needs vLLM: pip install 'rlvr[vllm]' on a CUDA machine") from exc
        from vllm import LLM

        if tokenizer is None:
            from rlvr.models.loading import load_tokenizer

            tokenizer = load_tokenizer(model_path)
        self.tokenizer = tokenizer
        self.weight_version = 0
        self.enable_sleep_mode = enable_sleep_mode
        self.asleep_tags: set[str] = set()  # what sleep() freed and no wake has restored yet
        self.vllm_version = vllm.__version__
        kwargs = dict(
            model=str(model_path),
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=enable_sleep_mode,
            enable_prefix_caching=enable_prefix_caching,
            enforce_eager=enforce_eager,
            tensor_parallel_size=tensor_parallel_size,
            seed=seed,
        )
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if _version_at_least(self.vllm_version, (0, 10, 2)):
            kwargs["logprobs_mode"] = "processed_logprobs"
        kwargs.update(llm_kwargs)
        self.logprobs_mode = kwargs.get("logprobs_mode", "raw_logprobs")
        saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        if device is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = _physical_gpu(device, saved)
        try:
            self.llm = LLM(**kwargs)
        finally:
            if device is not None:
                if saved is None:
                    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
                else:
                    os.environ["CUDA_VISIBLE_DEVICES"] = saved

    # -- weights -------------------------------------------------------------------------------
    def _inprocess_model(self):
        executor = getattr(getattr(self.llm, "llm_engine", None), "model_executor", None)
        worker = getattr(executor, "driver_worker", None)
        worker = getattr(worker, "worker", worker)  # V1 wraps the worker in a WorkerWrapperBase
        runner = getattr(worker, "model_runner", None)
        return getattr(runner, "model", None)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load HF-named tensors (model.named_parameters() of the trainer) into the engine. An
        engine asleep gets its weight memory back first; its KV cache stays freed until generate()."""
        if "weights" in self.asleep_tags:
            _release_cached_memory()
            self.llm.wake_up(tags=["weights"])
            self.asleep_tags.discard("weights")
        model = self._inprocess_model()
        if model is not None:
            model.load_weights(weights=((n, t.detach()) for n, t in named_tensors))
        else:
            weights = [(n, t.detach().cpu()) for n, t in named_tensors]
            self.llm.collective_rpc(_load_weights_on_worker, args=(weights,))
        self.llm.reset_prefix_cache()  # cached KV was computed with the old weights
        self.weight_version = int(version)

    def sleep(self, level: int = 1) -> None:
        """Free GPU memory while the learner runs (level 1: offload weights to CPU and drop the KV
        cache; level 2: drop both, the next update_weights refills them). A no-op unless the engine
        was built with enable_sleep_mode=True (colocated placement)."""
        if not self.enable_sleep_mode or self.asleep_tags:
            return
        self.llm.sleep(level=level)
        self.asleep_tags = {"weights", "kv_cache"}

    def wake_up(self) -> None:
        """Restore what sleep() freed (the rest of it, after update_weights woke the weights)."""
        if not self.asleep_tags:
            return
        # waking a tag twice would map its memory twice: wake only what is still asleep
        _release_cached_memory()
        self.llm.wake_up(tags=sorted(self.asleep_tags))
        self.asleep_tags = set()

    # -- generation ----------------------------------------------------------------------------
    def _params(self, spec: SamplingSpec, n: int, seed: int | None):
        from vllm import SamplingParams

        return SamplingParams(
            n=n,
            temperature=spec.temperature,
            top_p=spec.top_p,
            top_k=spec.top_k if spec.top_k > 0 else -1,  # -1 disables in every vLLM version
            max_tokens=spec.max_tokens,
            min_tokens=spec.min_tokens,
            stop=list(spec.stop) or None,
            include_stop_str_in_output=spec.include_stop_str_in_output,
            seed=seed,
            logprobs=0 if spec.logprobs else None,  # 0: only the sampled token's logprob
            skip_special_tokens=True,
        )

    def generate(
        self, prompts: list[str], spec: SamplingSpec, *, prompt_ids: Sequence[Sequence[int]] | None = None
    ) -> list[Rollout]:
        """len(prompts) * spec.n Rollouts, prompt-major (see rlvr.rollout.types.Generator)."""
        from vllm.inputs import TokensPrompt

        self.wake_up()
        prompt_ids = resolve_prompt_ids(self.tokenizer, prompts, prompt_ids)
        jobs: list[tuple[int, int]] = []  # (group, first sample index) per request
        requests, params = [], []
        for i, ids in enumerate(prompt_ids):
            if spec.seed is None:
                jobs.append((i, 0))
                requests.append(TokensPrompt(prompt_token_ids=list(ids)))
                params.append(self._params(spec, spec.n, None))
            else:
                for j in range(spec.n):
                    jobs.append((i, j))
                    requests.append(TokensPrompt(prompt_token_ids=list(ids)))
                    params.append(self._params(spec, 1, sequence_seed(spec.seed, i, j)))
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        rollouts = []
        for (i, j0), out in zip(jobs, outputs, strict=True):
            for k, c in enumerate(out.outputs):
                ids = list(c.token_ids)
                lps = None
                if spec.logprobs and c.logprobs is not None:
                    lps = [float(pos[t].logprob) for pos, t in zip(c.logprobs, ids, strict=True)]
                rollouts.append(
                    Rollout(
                        prompt=prompts[i],
                        prompt_ids=list(prompt_ids[i]),
                        response_ids=ids,
                        text=self._text(ids, c.stop_reason, spec, c.text),
                        logprobs=lps,
                        finish_reason="length" if c.finish_reason == "length" else "stop",
                        group=i,
                        weight_version=self.weight_version,
                        sample_index=j0 + k,
                        stop_reason=_stop_reason(c),
                    )
                )
        return rollouts

    def _text(self, ids: list[int], stop_reason, spec: SamplingSpec, vllm_text: str) -> str:
        if isinstance(stop_reason, str):
            hit = find_completed_stop(self.tokenizer, ids, (stop_reason,), spec.include_stop_str_in_output)
            return hit[1] if hit is not None else vllm_text
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def _release_cached_memory() -> None:
    """The learner's freed activations stay in PyTorch's caching allocator: hand them back to the
    driver before the engine maps its memory again, or sleeping saved nothing."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _physical_gpu(device: str, visible: str | None) -> str:
    """CUDA_VISIBLE_DEVICES value for the engine's child process: "cuda:1" -> the second GPU this
    process sees (mapped through an existing CUDA_VISIBLE_DEVICES list)."""
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    if visible:
        ids = [x.strip() for x in visible.split(",") if x.strip()]
        if index >= len(ids):
            raise ValueError(f"rollout.device={device!r}: only {len(ids)} GPU(s) visible ({visible})")
        return ids[index]
    return str(index)


def _stop_reason(completion) -> str | None:
    """vLLM's stop_reason is the stop string (str), a stop token id (int, e.g. a second EOS from
    generation_config) or None (EOS, or no stop at all): map to Rollout.stop_reason."""
    if completion.finish_reason == "length":
        return None
    if isinstance(completion.stop_reason, str):
        return completion.stop_reason
    return "<eos>"


def _version_at_least(version: str, minimum: tuple[int, ...]) -> bool:
    parts = []
    for p in version.split(".")[: len(minimum)]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts) >= minimum
