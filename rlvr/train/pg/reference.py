"""The reference policy of the KL penalty: absent, frozen at the start policy, or refreshed.

The old policy (the ratio's denominator: the weights that sampled the rollouts) and the reference
policy (the KL anchor) are different things; this module is only the second. Its whole lifecycle
lives here: built once before the loop, its logprobs per rollout batch, its refresh every
algo.ref_refresh_every steps, its snapshots on disk so that a resume from any checkpoint restores
the reference the uninterrupted run had then.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path

import torch

from rlvr.config import ConfigError
from rlvr.models import lora
from rlvr.runs.checkpoint import latest_checkpoint
from rlvr.train.batching import ForwardSpec
from rlvr.train.pg.objective import forward_logprobs
from rlvr.train.policy import load_model_at


class ReferencePolicy:
    """Frozen copy of the policy (or nothing when algo.kl_coef == 0); with a teacher (teacher.model, on-policy
    distillation) the teacher is the reference.

    A LoRA policy (model.lora_rank > 0) is its own reference: the same module with its adapter off (peft's
    disable_adapter()), i.e. the frozen base, so no second copy is held. Its reference cannot be refreshed
    (the base never changes): algo.ref_refresh_every is refused with it.

    A frozen copy is kept in the run directory (ref_policy/step_000000.pt, the start policy, and one snapshot
    per refresh), so that a resume needs only the run directory: the start run or folder model.init_from named
    may be gone by then (persist=False: the sharded learner, whose reference is sharded, keeps none)."""

    def __init__(self, model, *, enabled: bool, refresh_every: int = 0, teacher=None, persist: bool = True):
        self.refresh_every = refresh_every
        self.model = None
        self.persist = persist
        self.adapter_off = False  # the reference is `model` with its LoRA adapter disabled
        self.teacher = teacher is not None
        if enabled:
            if teacher is not None:
                self.model = teacher.eval()
                self.model.requires_grad_(False)
            elif lora.is_lora(model):
                if refresh_every > 0:
                    raise ConfigError(
                        f"algo.ref_refresh_every={refresh_every} with model.lora_rank>0: the reference of a LoRA "
                        "policy is its frozen base (the adapter switched off), which no refresh can move; set "
                        "algo.ref_refresh_every=0, or model.lora_rank=0 to train (and refresh from) every weight")
                self.model, self.adapter_off = model, True
            else:
                self.model = copy.deepcopy(model).eval()
                self.model.requires_grad_(False)

    def logprobs(self, batch, fwd: ForwardSpec) -> torch.Tensor | None:
        """(N, T) reference logprobs of `batch`, or None without a reference; at the sampling temperature and
        in the micro-batches of the policy's forwards (fwd), but never truncated to the sampler's top-k /
        top-p: the KL penalty is a divergence between the two models, and a token the policy sampled outside
        the reference's own nucleus still has its probability under the reference (docs/algorithms.md, "KL
        under top-p / top-k"). Each row's prompt is forwarded with it (the policy's shared prefix is its own
        forward's saving)."""
        if self.model is None:
            return None
        fwd = dataclasses.replace(fwd, shared_prefix=False, truncation=None)
        if not self.adapter_off:
            return forward_logprobs(self.model, batch, fwd)
        was = self.model.training
        self.model.eval()
        try:
            with self.model.disable_adapter():
                return forward_logprobs(self.model, batch, fwd)
        finally:
            self.model.train(was)

    # -- refresh and snapshots -------------------------------------------------------------------
    @property
    def _snapshots(self) -> bool:
        """A frozen copy of the policy that the run directory keeps (not a teacher, not the adapter-off base)."""
        return (self.model is not None and not self.adapter_off and not self.teacher
                and (self.persist or self.refresh_every > 0))

    @classmethod
    def kept(cls, cfg) -> bool:
        """Whether a resume of the run at cfg.run.out_dir finds its reference without model.init_from: there is
        none (algo.kl_coef 0), it is the teacher or a LoRA policy's base, or the run kept the snapshot its last
        checkpoint needs."""
        a = cfg.algo
        if a.kl_coef <= 0 or cfg.teacher.model or cfg.model.lora_rank > 0:
            return True
        ckpt = latest_checkpoint(cfg.run.out_dir)
        step = int(ckpt.name.split("_")[1]) if ckpt is not None else 0
        every = a.ref_refresh_every
        return cls.snapshot_path(Path(cfg.run.out_dir), step - step % every if every > 0 else 0).exists()

    @staticmethod
    def snapshot_path(run_path: Path, step: int) -> Path:
        return Path(run_path) / "ref_policy" / f"step_{step:06d}.pt"

    def start(self, run_path: Path, start_step: int) -> None:
        """New run (start_step 0): snapshot the start policy. Resume: load the reference of the last
        refresh step <= start_step."""
        if not self._snapshots:
            return
        if start_step == 0:
            self._save(run_path, 0, keep_from=0)
            return
        ref_step = start_step - start_step % self.refresh_every if self.refresh_every > 0 else 0
        path = self.snapshot_path(run_path, ref_step)
        if path.exists():
            self.model.load_state_dict(torch.load(path, weights_only=True))
        elif ref_step == 0:  # a run made before the start policy was kept: this copy is it (from model.init_from)
            self._save(run_path, 0, keep_from=0)
        else:
            raise FileNotFoundError(f"{path}: the reference snapshot of step {ref_step} (algo.ref_refresh_every) "
                                    "is missing from the run directory")

    def after_step(self, step: int, policy, run_path: Path, last_checkpoint: int) -> None:
        """Replace the reference by the policy every refresh_every steps; snapshots that no kept
        checkpoint can need are deleted."""
        if not self._snapshots or self.refresh_every <= 0 or step % self.refresh_every:
            return
        self.model.load_state_dict(policy.state_dict())
        self._save(run_path, step, keep_from=last_checkpoint - last_checkpoint % self.refresh_every)

    def _save(self, run_path: Path, step: int, keep_from: int) -> None:
        path = self.snapshot_path(run_path, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(self.model.state_dict(), tmp)
        os.replace(tmp, path)
        for old in path.parent.glob("step_*.pt"):
            if int(old.stem.split("_")[1]) < keep_from:
                old.unlink(missing_ok=True)


def load_teacher(tcfg, mcfg, tokenizer):
    """The teacher of on-policy distillation (teacher.model: a folder, run directory, checkpoint or hub id), in
    teacher.dtype / teacher.device (default the student's), or None when teacher.model is ''. The teacher
    scores the student's token ids, so its tokenizer must be the student's. What cannot be a teacher (not
    found, not loadable, another vocabulary) raises ConfigError naming teacher.model."""
    if not tcfg.model:
        return None
    teacher, t_tok, _ = load_model_at(tcfg.model, dtype=tcfg.dtype or mcfg.dtype, device=tcfg.device or mcfg.device,
                                      key="teacher.model")
    if t_tok.get_vocab() != tokenizer.get_vocab():
        raise ConfigError(f"teacher.model={tcfg.model!r}: its tokenizer is not the student's (model.name="
                         f"{mcfg.name!r}); the teacher scores the student's tokens, so both need the same one")
    return teacher
