"""The value model of PPO (algo.advantage=gae): a scalar head on a transformer trunk.

Two placements (algo.critic):
- ``shared``: a linear head on the policy's own last hidden state. The value is read from the same
  forward that scores the policy's tokens (score_tokens(..., with_hidden=True)), and the value loss
  is added to the policy loss, so the trunk learns from both (one forward, one backward).
- ``separate``: a copy of the start policy's trunk with its own head (how verl and OpenRLHF start a
  critic from the actor), trained by its own optimizer; the policy never sees the value loss.

In both, the head (and the separate trunk) are updated by the critic's own AdamW, stepped after each
policy optimizer step, so the policy's parameters, optimizer and weight push are unchanged (the head
is not part of the model the generator receives). Values are aligned with the policy's logprobs:
values[b, t] is V of the state that predicts labels[b, t], the token whose logprob is logp[b, t].

The critic's state (head, separate trunk, optimizer) is saved in every checkpoint as `critic.pt`
and restored on --resume.
"""

from __future__ import annotations

import copy

import torch

from rlvr.models import TrainingBatch
from rlvr.models.scoring import position_ids_of
from rlvr.train.batching import micro_batches


def _hidden_size(model) -> int:
    hf_config = getattr(model, "config", None)
    size = getattr(hf_config, "hidden_size", None) or getattr(hf_config, "n_embd", None)
    if not size:
        raise ValueError("algo.critic: cannot find the model's hidden size (config.hidden_size)")
    return int(size)


class Critic:
    """Value head (+ its own trunk when separate), with its optimizer.

    policy: the policy model (its trunk is read when shared, copied once when separate).
    """

    def __init__(self, policy, *, mode: str, lr: float, grad_clip: float):
        if mode not in ("shared", "separate"):
            raise ValueError(f"algo.critic={mode!r}: use 'shared' or 'separate'")
        self.mode = mode
        self.grad_clip = grad_clip
        device = next(policy.parameters()).device
        hidden = _hidden_size(policy)
        # Zero-initialised output: V = 0 everywhere at the start, the value every untrained baseline
        # starts from; the weights of a small random head would add noise to the first advantages.
        self.head = torch.nn.Linear(hidden, 1)
        with torch.no_grad():
            self.head.weight.zero_()
            self.head.bias.zero_()
        self.head.to(device=device, dtype=torch.float32)
        self.trunk = None
        if mode == "separate":
            self.trunk = copy.deepcopy(policy)
            self.trunk.train()
        params = list(self.head.parameters()) + (list(self.trunk.parameters()) if self.trunk is not None else [])
        self.params = [p for p in params if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, foreach=False)

    @property
    def shared(self) -> bool:
        return self.mode == "shared"

    def values_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """(b, T, H) hidden states -> (b, T) float32 values."""
        return self.head(hidden.float()).squeeze(-1)

    def forward(self, batch: TrainingBatch, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """(b, T) values of a micro-batch, with grad when grad is enabled. Shared: pass the policy's
        hidden states of the same forward; separate: the critic's trunk runs here."""
        if self.shared:
            if hidden is None:
                raise ValueError("shared critic: pass the policy forward's hidden states")
            return self.values_from_hidden(hidden)
        device = next(self.trunk.parameters()).device
        am = batch.attention_mask.to(device)
        out = self.trunk(input_ids=batch.input_ids.to(device), attention_mask=am, position_ids=position_ids_of(am),
                         use_cache=False, output_hidden_states=True)
        return self.values_from_hidden(out.hidden_states[-1])

    @torch.no_grad()
    def values(self, policy, batch: TrainingBatch, micro_batch_size: int, micro_batch_tokens: int = 0) -> torch.Tensor:
        """(N, T) float32 values of a whole batch, no grad, 0 where attention_mask is 0 (the
        rollout-time values V_old: GAE's baseline and the centre of the value clip)."""
        model = policy if self.shared else self.trunk
        was = model.training
        model.eval()
        out = torch.zeros(batch.labels.shape, dtype=torch.float32)
        seq_lens = batch.attention_mask.sum(-1).tolist()
        device = next(model.parameters()).device
        for chunk in micro_batches(seq_lens, max_rows=micro_batch_size, max_tokens=micro_batch_tokens):
            mb = batch.rows(torch.arange(chunk.start, chunk.stop))
            width = int(mb.attention_mask.sum(-1).max())
            am = mb.attention_mask[:, :width].to(device)
            hid = model(input_ids=mb.input_ids[:, :width].to(device), attention_mask=am,
                        position_ids=position_ids_of(am), use_cache=False, output_hidden_states=True).hidden_states[-1]
            v = self.values_from_hidden(hid)
            out[chunk.start:chunk.stop, :width] = torch.where(am.bool(), v, torch.zeros_like(v)).cpu()
        model.train(was)
        return out

    def step(self) -> float:
        """Clip the critic's own gradients (the policy's clip is separate), step, zero. Returns the
        gradient norm before clipping."""
        grads = [p for p in self.params if p.grad is not None]
        if not grads:
            return 0.0
        if self.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(grads, self.grad_clip)
        else:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad.float()) for p in grads]))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    # ------------------------------------------------------------------ checkpointing

    def state_dict(self) -> dict:
        return {
            "mode": self.mode,
            "head": self.head.state_dict(),
            "trunk": self.trunk.state_dict() if self.trunk is not None else None,
            "optimizer": self.optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("mode") != self.mode:
            raise ValueError(f"checkpoint's critic is {state.get('mode')!r} but algo.critic={self.mode!r}")
        self.head.load_state_dict(state["head"])
        if self.trunk is not None:
            self.trunk.load_state_dict(state["trunk"])
        self.optimizer.load_state_dict(state["optimizer"])
