"""The sharded learner: distributed.learner=fsdp2 (PyTorch FSDP2, docs/multi_gpu.md).

Launched as N processes (`torchrun --nproc_per_node N -m rlvr train CONFIG distributed.learner=fsdp2`, or one
process without torchrun: a group of one). Every rank builds the same policy from the same seed, then:

- the policy (and the KL reference, a copy made before sharding) is sharded with `fully_shard`, one FSDP
  unit per decoder layer plus the root: each rank holds 1/N of the parameters, their gradients and the
  AdamW state. model.dtype=bfloat16 with model.master_weights=float32 keeps float32 parameters (the
  masters) and computes in bfloat16 (MixedPrecisionPolicy, gradients reduced in float32);
- rank 0 alone samples, scores and evaluates, on the generator the placement builds from a full copy of
  the policy (hf: that copy; vllm: its engine); the step's Sampled batch is broadcast to every rank;
- each minibatch's loss normalizers come from the whole minibatch (rlvr.algo.aggregation), each rank
  runs the backward of its contiguous share of the rows, and FSDP reduces the shares' gradients (the
  mean back to the sum): the gradient is the one-process gradient up to float summation order. Every rank runs the
  same number of micro-batches (FSDP's collectives pair up): a rank with fewer rows runs zero-loss ones;
- the old-logprob, reference and value forwards run on the whole batch on every rank (no-grad);
- weight push: every parameter is gathered one at a time (DTensor.full_tensor) and handed to rank 0's
  engine as it arrives: no rank holds a second full copy beyond the engine's;
- checkpoints: the sharded model and optimizer state with torch.distributed.checkpoint (resumable on
  any number of shards, or by the one-process learner), plus the consolidated HF folder `model/` that
  `rlvr eval` and `model.init_from` load.

Not supported with fsdp2 (refused by TrainConfig.validate): distributed.placement=ray's data-parallel actors
(num_learners > 1), sampling ahead / partial rollouts (their behaviour policy runs on rank 0 alone),
algo.critic=separate, algo.ref_refresh_every.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import shutil
import signal
import socket
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist

from rlvr.algo import loss_normalizers
from rlvr.distributed.dp import shard_bounds
from rlvr.models import lora
from rlvr.models.export import push_tensors
from rlvr.models.loading import decoder_layers
from rlvr.models.packed import row_prompts, use_packing
from rlvr.runs import checkpoint as ckpt_mod
from rlvr.train.batching import micro_batches
from rlvr.train.pg.objective import StepStats, accumulate_gradients
from rlvr.train.session import (
    CheckpointFailed,
    RunLoop,
    TrainResult,
    maybe_die_after_checkpoint,
    resume_advice,
)


@dataclasses.dataclass
class Shards:
    """This process's place in the learner's process group, and the few collectives the loop needs.

    device: this rank's device, the one its process group's backend serves (cuda:LOCAL_RANK under NCCL, the CPU
    under gloo): every tensor handed to a collective is on it (NCCL's device map is CUDA only, so a CPU tensor
    there raises "No backend type associated with device type cpu")."""

    rank: int
    world: int
    device: torch.device
    owns_group: bool  # this module initialised the process group (and destroys it)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def broadcast(self, obj=None):
        """rank 0's `obj` on every rank (pickled)."""
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order, on every rank."""
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def max(self, n: int) -> int:
        """The largest of every rank's `n`."""
        t = torch.tensor([n], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t)

    def sum(self, x: float) -> float:
        """Every rank's `x` summed (in float64)."""
        t = torch.tensor([x], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return float(t)

    def sum_(self, t: torch.Tensor) -> None:
        """Sum `t` over the ranks, in place (through a copy on this rank's device when it lives elsewhere)."""
        on = t if t.device == self.device else t.to(self.device)
        dist.all_reduce(on, op=dist.ReduceOp.SUM)
        if on is not t:
            t.copy_(on.to(t.device))

    def barrier(self) -> None:
        dist.barrier()

    def close(self) -> None:
        global _OWN_ENV
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()
        if _OWN_ENV:  # a group of one: its rendezvous variables go with it (a later group, or a command this
            for key in _GROUP_OF_ONE:  # process starts, must not read a rank and a port that are no longer its)
                os.environ.pop(key, None)
            _OWN_ENV = False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_WATCHER: threading.Thread | None = None  # this process's exit_with_parent thread (one at most)
_OWN_ENV = False  # start() set RANK & co. itself (a group of one): no launcher to watch
_GROUP_OF_ONE = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")  # what start() sets without a launcher
_STARTED = False  # start() initialised a process group in this process (the command ends through exit_process)


def group_started() -> bool:
    """Whether start() initialised a process group in this process (rlvr.cli.main then ends it through
    exit_process)."""
    return _STARTED


def exit_process(exc: BaseException) -> NoReturn:
    """End a process whose command ran the sharded learner, with the exit status `exc` (the command's
    SystemExit, or what it raised) would give, without the interpreter's teardown.

    Why: destroy_process_group() (Shards.close, at the run's end) forgets the group, but the gloo backend
    and its C++ threads live on, held through DeviceMesh by torch's DTensor caches (redistribute plans,
    sharding propagation), until the interpreter tears its modules down at exit. Freeing the backend
    there joins threads that may need the GIL when the interpreter no longer grants it, and the process
    aborts: "terminate called without an active exception", SIGABRT, after a run that had finished (seen
    on a rank of the two-node resume in CI; torch's own atexit fix for this was abandoned). So the
    atexit handlers run as at any exit (trackers finish, worker pools stop), stdout and stderr are flushed,
    and os._exit ends the process: the run directory and checkpoints were closed by the run loop before."""
    import atexit
    import traceback

    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            status = 0
        elif isinstance(code, int):
            status = code
        else:  # sys.exit("message"): printed, status 1 (as the interpreter does)
            print(code, file=sys.stderr)
            status = 1
    else:
        traceback.print_exception(exc)
        status = 130 if isinstance(exc, KeyboardInterrupt) else 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed or broken pipe: nothing more can be said on it
                pass
        os._exit(status)


def exit_with_parent(poll_s: float = 1.0) -> threading.Thread:
    """End this process when its parent (the launcher, torchrun) is gone. torchrun starts its workers in sessions
    of their own, so a SIGKILLed torchrun (a preempted job, `kill -9`) would leave them training on, holding the
    GPUs and writing the run directory. A daemon thread checks os.getppid() every `poll_s` seconds and, when it
    changed (the parent died and this process was re-parented), says so and SIGKILLs this process: dying like
    the launcher keeps the crash-consistency of any kill (a resume uses the last complete checkpoint). A
    polling thread rather than prctl(PR_SET_PDEATHSIG), which fires when the launcher's spawning *thread*
    ends, not its process. Returns the thread."""
    parent = os.getppid()
    rank = os.environ.get("RANK", "?")

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                print(f"rank {rank}: the launcher (pid {parent}) is gone: this worker stops too", file=sys.stderr,
                      flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="rlvr-exit-with-parent", daemon=True)
    thread.start()
    return thread


def start(cfg) -> Shards | None:
    """The process group of distributed.learner=fsdp2 (None for the one-process learner): torchrun's
    environment (RANK, WORLD_SIZE, MASTER_ADDR, LOCAL_RANK), or a group of one without it. NCCL when the
    policy is on CUDA (each rank on cuda:LOCAL_RANK), gloo on CPU."""
    if cfg.distributed.learner != "fsdp2":
        return None
    cuda = str(cfg.model.device).startswith("cuda")
    owns = not dist.is_initialized()
    if owns:
        global _WATCHER, _OWN_ENV, _STARTED
        if "RANK" not in os.environ:  # one process, no launcher: a group of one
            os.environ.update(dict(zip(_GROUP_OF_ONE, ("0", "1", "0", "127.0.0.1", str(_free_port())), strict=True)))
            _OWN_ENV = True
        elif not _OWN_ENV and _WATCHER is None:  # a launcher's worker (torchrun): it must not outlive it
            _WATCHER = exit_with_parent()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if cuda else "gloo")
        _STARTED = True
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    return Shards(dist.get_rank(), dist.get_world_size(), device, owns)


def rank_config(cfg, shards: Shards | None):
    """The config a rank runs: ranks > 0 print nothing (rank 0 speaks for the run) and put the policy on
    their own device."""
    if shards is None:
        return cfg
    run = cfg.run if shards.main else dataclasses.replace(cfg.run, progress=False)
    model = dataclasses.replace(cfg.model, device=str(shards.device))
    return dataclasses.replace(cfg, run=run, model=model)


def shard(model, mcfg) -> None:
    """fully_shard `model` in place (each decoder layer, then the root). model.dtype=bfloat16 with
    master_weights=float32: float32 sharded parameters (the masters), bfloat16 compute, float32 gradient
    reduction. FSDP averages the ranks' gradients; ShardedGradients multiplies the mean back to the sum
    (gloo has no pre-scaled sum, so the divide factor cannot be set to 1 on CPU)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # FSDP2 warns on every forward that HF's output holds a view (an in-place op on it would skip the
    # all-gather); the loss functions never write into the logits (tests/train/pg/test_sharded.py compares gradients)
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    mp = MixedPrecisionPolicy()
    if mcfg.dtype == "bfloat16" and mcfg.master_weights == "float32":
        # the trained parameters become the float32 masters; a LoRA model's frozen base stays bfloat16 (peft keeps
        # its adapters in float32 already), so only what trains is float32 (FSDP2 needs one dtype for those)
        for p in model.parameters():
            if p.requires_grad:
                p.data = p.data.float()
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in decoder_layers(model):  # one FSDP unit each
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)


# ------------------------------------------------------------------------------------- the update


class ShardedGradients:
    """accumulate_gradients' signature over the ranks (see the module docstring): this rank's share of the
    minibatch's rows, under the whole minibatch's normalizers; the loss and statistics summed over ranks. The
    share's micro-batches are cut as accumulate_gradients cuts them (real tokens when packed), and FSDP2 syncs
    (reduce-scatters) the gradients once, in the last one's backward."""

    def __init__(self, shards: Shards):
        self.shards = shards

    def __call__(self, model, mb, parts, fwd, *, norm_length: int = 0, critic=None, stats=None,
                 row_entropy=None) -> float:
        sh = self.shards
        n = mb.batch.input_ids.shape[0]
        norm = loss_normalizers(mb.batch.response_mask, constant=float(norm_length) if norm_length else None)
        bounds = shard_bounds(n, sh.world) + [(n, n)] * max(0, sh.world - n)
        lo, hi = bounds[sh.rank]
        if mb.row_ids is None:
            mb = dataclasses.replace(mb, row_ids=list(range(n)))
        share = dataclasses.replace(mb.part(lo, hi), batch=mb.batch.rows(torch.arange(lo, hi)))
        # one accumulate_gradients call per micro-batch, so that every rank runs the same number; cut as
        # accumulate_gradients cuts them (packed: on real tokens, each shared prompt counted once)
        seq_lens = share.batch.attention_mask.sum(-1).tolist()
        packed = bool(seq_lens) and critic is None and use_packing(model, fwd.packing)
        prompts = row_prompts(share.batch.input_ids, share.batch.response_mask) if packed and fwd.shared_prefix else None
        pieces = micro_batches(seq_lens, max_rows=fwd.micro_batch, max_tokens=fwd.micro_batch_tokens, packed=packed,
                               prompts=prompts) if seq_lens else []
        count = sh.max(len(pieces))
        # FSDP2 reduce-scatters a unit's gradients after each backward unless told not to: only the minibatch's
        # last micro-batch syncs; the ones before accumulate the unsharded gradients (in the reduce dtype)
        sync = getattr(model, "set_requires_gradient_sync", None)
        one = dataclasses.replace(fwd, micro_batch=0, micro_batch_tokens=0)
        local_stats = StepStats() if stats is not None else None
        ent: dict[int, float] = {}
        loss = 0.0
        for k in range(count):
            if sync is not None:
                sync(k == count - 1)
            if k < len(pieces):
                c = pieces[k]
                part = dataclasses.replace(share.part(c.start, c.stop),
                                           batch=share.batch.rows(torch.arange(c.start, c.stop)))
                loss += accumulate_gradients(model, part, parts, one, norm_length=norm_length, normalizers=norm,
                                             critic=critic, stats=local_stats, row_entropy=ent)
            else:
                _zero_backward(model, mb.batch, critic)
        if sh.world > 1:  # FSDP reduced the mean over ranks; each rank's loss had the whole minibatch's
            # normalizers, so the minibatch's gradient is the sum (exact for a power-of-two world size)
            with torch.no_grad():
                for p in model.parameters():
                    if p.grad is not None:
                        p.grad.mul_(sh.world)
        if critic is not None:  # the value head is replicated: sum its gradients over ranks
            for p in critic.head.parameters():
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                sh.sum_(p.grad)
        total = sh.sum(loss)
        if stats is not None or row_entropy is not None:
            for st, e in sh.gather((local_stats, ent)):
                if stats is not None:
                    stats.merge(st)
                if row_entropy is not None:
                    row_entropy.update(e)
        return total


def _zero_backward(model, batch, critic) -> None:
    """A forward and backward that contributes nothing: a rank with no rows left still takes part in
    every micro-batch's all-gathers and reduce-scatters."""
    ids = batch.input_ids[:1, :2].to(next(iter(model.parameters())).device)
    out = model(input_ids=ids, output_hidden_states=critic is not None)
    zero = out.logits.float().sum() * 0.0
    if critic is not None:
        zero = zero + critic.values_from_hidden(out.hidden_states[-1]).sum() * 0.0
    zero.backward()


def clip_and_step(model, optimizer, scheduler, grad_clip: float) -> float:
    """rlvr.train.optimizer.clip_and_step over sharded parameters: the global gradient norm (all shards),
    clipped with torch's clip_grad_norm_ (DTensor-aware), then the optimizer and scheduler step."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)


# ----------------------------------------------------------------------------------- the samples


class ShardedSource:
    """The rollout source on every rank: rank 0 runs the real one (sampling, scoring, evaluation) and
    broadcasts each step's Sampled; every rank takes part in the weight push's gathers."""

    def __init__(self, inner, shards: Shards):
        self.inner, self.shards = inner, shards
        self.sampler = inner.sampler if inner is not None else None

    def start(self, step: int, model) -> None:
        if step:  # the checkpoint's weights replaced those the engine was built with
            self._push(step, model)

    def collect(self, step: int, data_pos: int, timer):
        return self.shards.broadcast(self.inner.collect(step, data_pos, timer) if self.shards.main else None)

    def old_logprobs_fn(self, rollouts, step):
        return None

    def sleep(self) -> None:
        if self.shards.main:
            self.inner.sleep()

    def after_update(self, step: int, model) -> None:
        self._push(step, model)

    def _push(self, step: int, model) -> None:
        tensors = iter(push_tensors(model))  # one stream: gathered (and merged, LoRA) one parameter at a time
        if self.shards.main:
            self.inner.engine.update_weights(tensors, version=step)
        for _ in tensors:  # ranks > 0 (and whatever the engine left): the gathers pair up
            pass

    def metrics(self) -> dict:
        return self.inner.metrics() if self.shards.main else {}

    def extras(self) -> dict:
        return {}

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()


# ------------------------------------------------------------------------------- run loop, checkpoints


def save(shards: Shards, ckpt_dir: Path, step: int, model, optimizer, write) -> None:
    """One checkpoint of a sharded run (collective): the sharded state (torch.distributed.checkpoint) into a
    staging folder every rank writes, the consolidated model gathered to rank 0 (cpu), then on rank 0
    write(full_state_dict, staging) writes the rest atomically with the staging folder moved in."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    staging = Path(ckpt_dir) / f".sharded-{ckpt_mod.checkpoint_name(step)}"
    if shards.main:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    shards.barrier()
    ckpt_mod.save_sharded_state(staging, model, optimizer)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if shards.main:
        write(full, staging)
    shards.barrier()


class ShardedRunLoop(RunLoop):
    """Rank 0's RunLoop (rlvr.train.session): the run directory, logs and progress as one process has them;
    each checkpoint decision is broadcast and the save is collective (save)."""

    def __init__(self, shards: Shards, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.shards = shards
        self.writes = True

    def checkpoint(self, step: int, trainer_state: dict, *, force: bool = False) -> bool:
        if not self.shards.broadcast(self.checkpoint_due(step, force)):
            return False
        self.save(step, trainer_state)
        self.stop.saved(step)
        maybe_die_after_checkpoint(step, self.run)
        return True

    def save(self, step: int, trainer_state: dict) -> None:
        dtype = getattr(torch, self.cfg.model.dtype)  # the export in the model's dtype (bf16 masters are fp32)

        def write(full, staging):
            if not lora.is_lora(self.model):  # (a LoRA run's base is in its dtype, its adapter float32 as peft keeps it)
                full = {k: v.to(dtype) if v.is_floating_point() else v for k, v in full.items()}
            ckpt_mod.save_checkpoint(self.run, step, model=self.model, tokenizer=self.tokenizer, optimizer=None,
                                     scheduler=self.scheduler, trainer_state=trainer_state,
                                     keep=self.cfg.run.keep_checkpoints, extras=self.extras, state_dict=full,
                                     move_in={ckpt_mod.SHARDED_DIR: staging}, meta={"shards": self.shards.world})

        try:
            save(self.shards, self.run.checkpoints_dir, step, self.model, self.optimizer, write)
        except ckpt_mod.CheckpointSaveError as exc:  # rank 0's write (a full disk): said as RunLoop.save says it
            raise CheckpointFailed(f"{exc}. {resume_advice(self.command, self.run.path, exc.intact)}") from exc


class _Quiet:
    """What ranks > 0 have instead of a run directory's writers and the signal handler."""

    requested = None
    last_ckpt = 0

    def __getattr__(self, name):
        return lambda *a, **k: None


class FollowerLoop:
    """Ranks > 0: RunLoop's interface without files (rank 0 writes the run directory); a resume loads the
    same checkpoint (collectively with rank 0), and each checkpoint's sharded save is joined."""

    writes = False

    def __init__(self, shards: Shards, cfg, *, resume: bool, model, optimizer, scheduler, extras=None):
        self.shards, self.cfg, self.resume = shards, cfg, resume
        self.model, self.optimizer, self.scheduler, self.extras = model, optimizer, scheduler, extras or None
        self.path = Path(cfg.run.out_dir)
        self.run = self.stop = _Quiet()
        self._closers: list = []

    def __enter__(self) -> FollowerLoop:
        self.state = {}
        if self.resume:
            self.state = ckpt_mod.load_checkpoint(self.path, model=self.model, optimizer=self.optimizer,
                                                  scheduler=self.scheduler, extras=self.extras)
        self.start_step = int(self.state.get("step", 0))
        return self

    def __exit__(self, *exc) -> None:
        for fn in self._closers:
            fn()

    def on_close(self, fn) -> None:
        self._closers.append(fn)

    def due(self, step: int, every: int) -> bool:
        return False  # evaluation runs on rank 0's engine only (it holds no collective)

    def log(self, step: int, metrics: dict, on_step=None, **shown) -> dict:
        return {}

    def checkpoint(self, step: int, trainer_state: dict, *, force: bool = False) -> bool:
        if not self.shards.broadcast(None):
            return False
        save(self.shards, self.path / "checkpoints", step, self.model, self.optimizer, None)
        return True

    def result(self, steps: int) -> TrainResult:
        return TrainResult(run_dir=self.path, steps=steps, last_metrics={})


def run_loop(shards: Shards, cfg, command: str, *, resume: bool, model, tokenizer, optimizer, scheduler, task,
             extras=None):
    """This rank's run loop: ShardedRunLoop on rank 0, FollowerLoop on the others."""
    if shards.main:
        loop = ShardedRunLoop(shards, cfg, command, resume=resume, model=model, tokenizer=tokenizer,
                              optimizer=optimizer, scheduler=scheduler, task=task, extras=extras)
    else:
        loop = FollowerLoop(shards, cfg, resume=resume, model=model, optimizer=optimizer, scheduler=scheduler,
                            extras=extras)
    loop.on_close(shards.close)  # the process group ends with the run
    return loop


def generator_model(model, shards: Shards | None):
    """The module rank 0's engine is built on: a full copy made before the learner is sharded (hf samples
    with it and receives each push; vllm builds its engine from it), None on ranks > 0; without shards,
    the learner's own module (the hf engine shares it)."""
    if shards is None:
        return model
    if not shards.main:
        return None
    return copy.deepcopy(model)
