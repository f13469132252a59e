"""Methods added to every vLLM worker (`LLM(worker_extension_cls=...)`), called by name through
`LLM.collective_rpc`, so no pickled function crosses to the engine (no VLLM_ALLOW_INSECURE_SERIALIZATION).

This module must import without vLLM (the worker class is looked up by its dotted path inside the
engine process, where vLLM is loaded) and without importing rlvr's heavier layers.

- `rlvr_reload_from_file(path)`: the weights of a push that crosses a process boundary. The trainer
  writes its HF-named tensors to one safetensors file (in /dev/shm where it exists: memory, not disk);
  the worker maps it and hands the tensors to vLLM's own in-place reload (`Worker.reload_weights`,
  vllm >= 0.2x: it restores the loaders that the engine's post-load processing removed, which a
  bare `model.load_weights` after startup does not; that was the first real engine's
  "'Parameter' object has no attribute 'weight_loader'").
- `rlvr_weight_fingerprint()`: float64 sum and sum of squares of every parameter of the engine's
  model: a cheap "did the weights change" probe for tests and the push check.
"""

from __future__ import annotations


class WeightPush:
    """Mixed into vLLM's Worker class by vLLM (worker_extension_cls); `self` is the worker."""

    def rlvr_reload_from_file(self, path: str) -> int:
        from safetensors.torch import load_file

        tensors = load_file(path)  # memory-mapped CPU tensors
        self.reload_weights(weights_iterator=iter(tensors.items()), is_checkpoint_format=True)
        return len(tensors)

    def rlvr_weight_fingerprint(self) -> tuple[float, float]:
        import torch

        model = self.model_runner.get_model() if hasattr(self.model_runner, "get_model") else self.model_runner.model
        s = s2 = 0.0
        with torch.no_grad():
            for p in model.parameters():
                x = p.detach().double()
                s += float(x.sum())
                s2 += float((x * x).sum())
        return s, s2
