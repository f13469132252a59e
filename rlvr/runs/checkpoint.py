"""Atomic checkpoints with exact RNG state, and their loading.

    RUN_DIR/checkpoints/
      latest               text file: the name of the newest complete checkpoint ("step_000020")
      step_000010/
        model/             model.save_pretrained (+ tokenizer.save_pretrained): a loadable HF folder
                           (plain nn.Modules: model/model.pt holding the state_dict; a LoRA model: peft's
                           adapter_model.safetensors + adapter_config.json, its base in RUN/base_model,
                           written once: rlvr.models.lora)
        optimizer.pt       optimizer.state_dict()          (when given)
        scheduler.pt       scheduler.state_dict()          (when given)
        rng.pt             torch CPU (+ CUDA) generator states
        rng.json           python `random` and numpy global states
        trainer_state.json the trainer's counters, data position, ... (JSON)
        meta.json          {"step", "format", "files"}; written last

Atomicity: everything is written into `checkpoints/.tmp-step_000010-<pid>/`, every file and the
folder are fsynced, the folder is renamed to `step_000010`, the parent folder is fsynced, and only
then `latest` is replaced (write `latest.tmp`, fsync, os.replace). A crash at any point leaves the
previous checkpoint and the previous `latest` intact; leftover `.tmp-*` folders (and a LoRA base model's
interrupted copy, RUN/.tmp-base_model-<pid>) are removed by the next save or resume, whatever pid wrote them
(a run directory has one writer: rlvr.runs.rundir's lock). An old checkpoint is deleted by renaming it to
`.tmp-del-...` first, so a crash mid-delete never leaves a half-deleted folder that looks complete. Loading
never trusts `latest` blindly: if it is missing or names an incomplete folder, the newest folder with a
meta.json is used.

A save that fails (a full disk: OSError ENOSPC, torch's "PytorchStreamWriter failed writing file") raises
CheckpointSaveError saying which step was lost and which checkpoint is intact. A checkpoint damaged after the
fact (a truncated or empty file, garbage JSON) is CheckpointDamaged naming the file; resume_checkpoint then
takes the previous complete checkpoint (saying so), or says how to.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import re
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from rlvr.models import lora
from rlvr.models.loading import save_policy

FORMAT_VERSION = 1
_STEP_RE = re.compile(r"^step_(\d+)$")

__all__ = [
    "CheckpointDamaged",
    "CheckpointSaveError",
    "checkpoint_name",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "resume_checkpoint",
    "save_checkpoint",
]


def checkpoint_name(step: int) -> str:
    """`step_000010`: zero-padded so names sort by step."""
    return f"step_{int(step):06d}"


def _checkpoints_dir(run_dir: Any) -> Path:
    path = Path(getattr(run_dir, "path", run_dir))
    return path if path.name == "checkpoints" else path / "checkpoints"


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # some platforms cannot open directories; rename is still atomic there
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            _fsync_file(Path(dirpath) / name)
        _fsync_dir(Path(dirpath))


def write_text_atomic(path: Path, text: str) -> None:
    """`path` holds `text` or what it held before, never a part: written to `<path>.tmp`, fsynced, renamed over
    `path` (os.replace), and the folder fsynced."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


_write_atomic_text = write_text_atomic


def remove_checkpoint(path: Path) -> None:
    """Delete a checkpoint folder: renamed to `.tmp-del-<name>-<pid>` first (atomic), then removed, so a crash
    mid-delete leaves a temporary the next save or resume removes, never a half-deleted step_* with a meta.json."""
    path = Path(path)
    trash = path.with_name(f".tmp-del-{path.name}-{os.getpid()}")
    try:
        os.rename(path, trash)
    except OSError:
        trash = path
    shutil.rmtree(trash, ignore_errors=True)


def remove_stale_temporaries(run_path: Path, ckpt_dir: Path | None = None) -> None:
    """Remove what crashed saves left in a run directory, of any pid: checkpoints/.tmp-* (a checkpoint being
    written, an old one being deleted or swapped out) and RUN/.tmp-base_model-* (a LoRA run's base being
    written; a full copy of the base model). Only the run's one writer calls this (rlvr.runs.rundir's lock)."""
    run_path = Path(run_path)
    ckpt_dir = run_path / "checkpoints" if ckpt_dir is None else Path(ckpt_dir)
    stale = [*ckpt_dir.glob(".tmp-*"), *run_path.glob(f".tmp-{lora.BASE_DIR}-*")] if run_path.is_dir() else []
    for p in stale:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def list_checkpoints(run_dir: Any) -> list[Path]:
    """Complete checkpoint folders (with meta.json), oldest first."""
    ckpt_dir = _checkpoints_dir(run_dir)
    if not ckpt_dir.is_dir():
        return []
    found = []
    for p in ckpt_dir.iterdir():
        m = _STEP_RE.match(p.name)
        if m and p.is_dir() and (p / "meta.json").exists():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: Any) -> Path | None:
    """The checkpoint `latest` names if it is complete, else the newest complete one, else None."""
    ckpt_dir = _checkpoints_dir(run_dir)
    pointer = ckpt_dir / "latest"
    if pointer.exists():
        target = ckpt_dir / pointer.read_text(encoding="utf-8").strip()
        if target.is_dir() and (target / "meta.json").exists():
            return target
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


# ------------------------------------------------------------------------------------ RNG state


def _rng_state() -> tuple[dict, dict[str, torch.Tensor]]:
    version, internal, gauss = random.getstate()
    js: dict[str, Any] = {"python": [version, list(internal), gauss]}
    try:
        import numpy as np

        name, keys, pos, has_gauss, cached = np.random.get_state()
        js["numpy"] = [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]
    except ImportError:
        pass
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = state
    return js, tensors


def _set_rng_state(js: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> None:
    version, internal, gauss = js["python"]
    random.setstate((version, tuple(internal), gauss))
    if "numpy" in js:
        import numpy as np

        name, keys, pos, has_gauss, cached = js["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = sorted((k for k in tensors if k.startswith("torch_cuda_")), key=lambda k: int(k.rsplit("_", 1)[1]))
    if cuda and torch.cuda.is_available():
        states = [tensors[k] for k in cuda]
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)
        else:  # a different number of GPUs: restore the ones both have
            for i, state in enumerate(states[: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(state, i)


# ------------------------------------------------------------------------------------ save/load


def _unwrap(model: Any) -> Any:
    return getattr(model, "module", model)  # DDP / compiled wrappers keep the real model in .module


@contextlib.contextmanager
def _no_hf_progress_bars():
    """transformers 5 draws a "Writing model shards" tqdm bar on save_pretrained: noise in every
    non-TTY log, once per checkpoint. Turn it off for the save and restore the setting."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        yield
        return
    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def save_checkpoint(
    run_dir: Any,
    step: int,
    *,
    model: Any,
    tokenizer: Any = None,
    optimizer: Any = None,
    scheduler: Any = None,
    trainer_state: Mapping[str, Any] | None = None,
    rng: bool = True,
    keep: int | None = 2,
    extras: Mapping[str, Any] | None = None,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    move_in: Mapping[str, Path] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> Path:
    """Write checkpoint `step` of `run_dir` (a RunDir or a path) atomically; see the module doc.

    model: has `save_pretrained` (HF; saved as safetensors with its config) or `state_dict`.
    trainer_state: JSON-able dict (data position, counters, ...); checked before anything is written.
    keep: keep this many newest checkpoints (None or 0 = keep all); the new one is never removed.
    extras: more stateful objects (state_dict/load_state_dict), saved as <name>.pt (a PPO critic).
    state_dict: the model weights to write instead of model.state_dict() (a sharded learner's gathered
    full state). move_in: folders already written (a sharded learner's torch.distributed.checkpoint
    state) moved into the checkpoint under the given names. meta: more fields for meta.json.
    Returns the checkpoint folder.
    """
    state = dict(trainer_state or {})
    try:
        state_text = json.dumps(state, indent=1, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"trainer_state must be JSON-able (no NaN), got an error: {exc}") from exc
    ckpt_dir = _checkpoints_dir(run_dir)
    try:
        return _save(ckpt_dir, step, state_text, model=model, tokenizer=tokenizer, optimizer=optimizer,
                     scheduler=scheduler, rng=rng, keep=keep, extras=extras, state_dict=state_dict,
                     move_in=move_in, meta=meta)
    except (OSError, RuntimeError) as exc:  # a full disk, an I/O error, torch's "file write failed"
        raise _save_error(ckpt_dir, step, exc) from exc
    except Exception as exc:
        if type(exc).__name__ == "SafetensorError":  # safetensors' own write error (not an OSError)
            raise _save_error(ckpt_dir, step, exc) from exc
        raise


class CheckpointSaveError(OSError, RuntimeError):
    """A checkpoint could not be written (a full disk, an I/O error). Nothing of it is left behind, and the
    message says which step was lost and which checkpoint is intact. `step`: the step being saved; `intact`:
    the newest complete checkpoint (None when there is none); `cause`: the error (an OSError or torch's
    RuntimeError "PytorchStreamWriter failed writing file", hence both bases)."""

    def __init__(self, message: str, *, step: int, intact: Path | None, cause: BaseException):
        super().__init__(message)
        self.step, self.intact, self.cause = step, intact, cause

    def __str__(self) -> str:
        return str(self.args[0])


def _save_error(ckpt_dir: Path, step: int, exc: BaseException) -> CheckpointSaveError:
    why = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        why = f"the disk is full ({why})"
    try:
        free = shutil.disk_usage(ckpt_dir if ckpt_dir.exists() else ckpt_dir.parent).free
        why += f"; {free / 2**20:.0f} MiB free on its disk now"
    except OSError:
        pass
    intact = latest_checkpoint(ckpt_dir)
    if intact is not None and intact.name == checkpoint_name(step):  # complete: what failed came after it
        return CheckpointSaveError(
            f"saving the checkpoint of step {step} failed ({why}), but {intact} is complete and a resume continues "
            "from it", step=step, intact=intact, cause=exc)
    if intact is None:
        kept = "no earlier checkpoint was saved, so nothing of this run can be resumed"
    else:
        kept = (f"the last intact checkpoint is {intact.name} (step {int(intact.name.split('_')[1])}) in "
                f"{ckpt_dir}: a resume repeats the steps after it")
    return CheckpointSaveError(f"the checkpoint of step {step} could not be written ({why}): step {step} is lost "
                               f"and nothing of it was left behind; {kept}", step=step, intact=intact, cause=exc)


def _save(ckpt_dir: Path, step: int, state_text: str, *, model, tokenizer, optimizer, scheduler, rng, keep,
          extras, state_dict, move_in, meta) -> Path:
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(ckpt_dir.parent, ckpt_dir)  # left by a save that crashed
    name = checkpoint_name(step)
    final = ckpt_dir / name
    tmp = ckpt_dir / f".tmp-{name}-{os.getpid()}"
    tmp.mkdir()
    try:
        files = []
        real = _unwrap(model)
        model_dir = tmp / "model"
        model_dir.mkdir()
        sd = {} if state_dict is None else {"state_dict": state_dict}
        if lora.is_lora(real):
            with _no_hf_progress_bars():
                _save_lora(real, tokenizer, model_dir, ckpt_dir.parent, **sd)
        elif hasattr(real, "save_pretrained"):
            with _no_hf_progress_bars():
                if tokenizer is not None:
                    save_policy(real, tokenizer, model_dir, **sd)  # load_policy(<ckpt>/model) round-trips exactly
                else:
                    real.save_pretrained(model_dir, **sd)
        else:
            torch.save(dict(state_dict) if state_dict is not None else real.state_dict(), model_dir / "model.pt")
            if tokenizer is not None:
                tokenizer.save_pretrained(model_dir)
        files.append("model")
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            files.append("optimizer.pt")
        if scheduler is not None:
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
            files.append("scheduler.pt")
        for extra, obj in (extras or {}).items():  # (not `name`: that is the checkpoint's, used below)
            torch.save(obj.state_dict(), tmp / f"{extra}.pt")
            files.append(f"{extra}.pt")
        if rng:
            js, tensors = _rng_state()
            (tmp / "rng.json").write_text(json.dumps(js), encoding="utf-8")
            torch.save(tensors, tmp / "rng.pt")
            files += ["rng.json", "rng.pt"]
        (tmp / "trainer_state.json").write_text(state_text, encoding="utf-8")
        files.append("trainer_state.json")
        for folder, src in (move_in or {}).items():
            os.rename(src, tmp / folder)
            files.append(folder)
        info = {"step": int(step), "format": FORMAT_VERSION, "files": files} | dict(meta or {})
        (tmp / "meta.json").write_text(json.dumps(info), encoding="utf-8")  # completeness marker, last
        _fsync_tree(tmp)
        if final.exists():  # re-saving a step (e.g. after a resume): swap, then delete the old one
            old = ckpt_dir / f".tmp-old-{name}-{os.getpid()}"
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        _fsync_dir(ckpt_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_text_atomic(ckpt_dir / "latest", name + "\n")
    if keep:
        for old_ckpt in list_checkpoints(ckpt_dir)[:-keep]:
            if old_ckpt != final:
                remove_checkpoint(old_ckpt)
    return final


def _resolve(path_or_run_dir: Any) -> Path:
    path = Path(getattr(path_or_run_dir, "path", path_or_run_dir))
    if (path / "meta.json").exists():
        return path
    found = latest_checkpoint(path)
    if found is None:
        raise FileNotFoundError(f"no complete checkpoint in {path} (looked for checkpoints/step_*/meta.json)")
    return found


def _save_lora(model: Any, tokenizer: Any, model_dir: Path, run_path: Path, state_dict: Any = None) -> None:
    """A LoRA model's checkpoint: peft's adapter files (+ tokenizer) in model/, the frozen base written once
    per run in RUN/base_model (rlvr.models.lora, module doc), named relative to model/ in adapter_config.json.
    state_dict: the peft model's full state dict to write from (a sharded learner's, gathered on this rank)."""
    base = run_path / lora.BASE_DIR
    if not (base / "config.json").exists():
        tmp = run_path / f".tmp-{lora.BASE_DIR}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        if tokenizer is None:
            raise ValueError("save_checkpoint of a LoRA model needs its tokenizer (the base model folder holds it)")
        lora.save_base(model, tokenizer, tmp, state_dict)
        _fsync_tree(tmp)
        shutil.rmtree(base, ignore_errors=True)  # a base folder without config.json: an interrupted write
        os.replace(tmp, base)
        _fsync_dir(run_path)
    lora.save_adapter(model, model_dir, base_ref=f"../../../{lora.BASE_DIR}", state=state_dict)
    if tokenizer is not None:
        tokenizer.save_pretrained(model_dir)


class CheckpointDamaged(FileNotFoundError):
    """A complete checkpoint (it has its meta.json) whose file cannot be read: truncated, empty, garbage,
    missing. `path`: the checkpoint folder; `file`: the file. (A FileNotFoundError: no usable checkpoint there,
    which the commands report as an error without a traceback.)"""

    def __init__(self, message: str, *, path: Path, file: Path):
        super().__init__(message)
        self.path, self.file = path, file

    def __str__(self) -> str:
        return str(self.args[0])


def _damaged(ckpt: Path, file: Path, why: str) -> CheckpointDamaged:
    return CheckpointDamaged(f"checkpoint {ckpt.name} is damaged: {file} {why}", path=ckpt, file=file)


def _read(ckpt: Path, file: Path, reader, errors: tuple[type[BaseException], ...] = (Exception,)) -> Any:
    """reader(file), or CheckpointDamaged naming the file when it cannot be read."""
    file = Path(file)
    try:
        size = file.stat().st_size
    except FileNotFoundError:
        raise _damaged(ckpt, file, "is missing") from None
    if size == 0 and file.is_file():
        raise _damaged(ckpt, file, "is empty (0 bytes)")
    try:
        return reader(file)
    except errors as exc:
        raise _damaged(ckpt, file, f"cannot be read ({type(exc).__name__}: {str(exc)[:200] or 'no message'})") from exc


def _torch_file(path: Path) -> Any:
    return torch.load(path, map_location="cpu", weights_only=True)


def _json_file(kind: type) -> Any:
    def read(path: Path) -> Any:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, kind):
            raise ValueError(f"holds a {type(data).__name__}, not a JSON {'object' if kind is dict else kind.__name__}")
        return data

    return read


def _is_read_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError | ValueError | EOFError) or type(exc).__name__ == "SafetensorError"


def _load_model_weights(model: Any, model_dir: Path) -> None:
    real = _unwrap(model)
    ckpt = model_dir.parent
    if lora.is_adapter_dir(model_dir):
        if not lora.is_lora(real):
            raise RuntimeError(f"{model_dir} holds a LoRA adapter but the model has none: resume it with the "
                               "model.lora_rank it was trained with")
        try:
            lora.load_adapter(real, model_dir)
        except Exception as exc:
            if not _is_read_error(exc):
                raise
            file = Path(getattr(exc, "filename", None) or model_dir)
            raise _damaged(ckpt, file, f"cannot be read ({type(exc).__name__}: {str(exc)[:200]})") from exc
        return
    if lora.is_lora(real):
        raise RuntimeError(f"{model_dir} holds a full model but model.lora_rank > 0: resume it with the config it "
                           "was started with (model.lora_rank=0)")
    if (model_dir / "model.pt").exists():
        real.load_state_dict(_read(ckpt, model_dir / "model.pt", _torch_file))
        return
    from safetensors.torch import load_file

    shards = sorted(model_dir.glob("*.safetensors"))
    if not shards:
        raise _damaged(ckpt, model_dir, "has no model weights (*.safetensors or model.pt)")
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        state.update(_read(ckpt, shard, lambda f: load_file(str(f))))
    result = real.load_state_dict(state, strict=False)
    # save_pretrained drops tied copies (lm_head.weight tied to the embedding); those are filled by
    # the tie. Anything else missing or unexpected is a real mismatch.
    current = real.state_dict()
    loaded_ptrs = {current[k].data_ptr() for k in state if k in current}
    missing = [k for k in result.missing_keys if current[k].data_ptr() not in loaded_ptrs]
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"{model_dir}: checkpoint does not match the model: missing {missing[:5]}, "
            f"unexpected {list(result.unexpected_keys)[:5]}"
        )


SHARDED_DIR = "sharded"  # a sharded learner's torch.distributed.checkpoint folder (rlvr.train.pg.sharded)


def is_sharded_module(model: Any) -> bool:
    """A sharded learner's module (FSDP2): its ranks load their own files."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def sharded_state(model: Any, optimizer: Any) -> dict[str, Any]:
    """{"model", "optim"}: the state torch.distributed.checkpoint saves and loads, keyed by parameter
    names (the same for a sharded module, any number of shards, and the plain one-process module)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optimizer if optimizer is not None else [])
    return {"model": msd, "optim": osd} if optimizer is not None else {"model": msd}


def save_sharded_state(folder: Path, model: Any, optimizer: Any) -> None:
    """Write sharded_state(model, optimizer) to `folder` (every rank of the group calls it)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(sharded_state(model, optimizer), checkpoint_id=str(folder))


def load_sharded_state(ckpt: Path, model: Any, optimizer: Any) -> None:
    """Model (and optimizer) state from a checkpoint's sharded folder into this process's module, sharded
    over any number of ranks or not at all (torch.distributed.checkpoint reshards on load)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    folder = Path(ckpt) / SHARDED_DIR
    if not folder.is_dir():
        raise FileNotFoundError(
            f"{ckpt}: no {SHARDED_DIR}/ folder: this checkpoint was written by the one-process learner, and "
            "distributed.learner=fsdp2 resumes only sharded checkpoints; resume it without distributed.learner=fsdp2, "
            "or start a new sharded run from its weights with model.init_from")
    state = sharded_state(model, optimizer)
    with warnings.catch_warnings():  # one process without a group: DCP says it loads in a single process
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(model, optimizer if optimizer is not None else [], model_state_dict=state["model"],
                   optim_state_dict=state.get("optim", {}))


def load_checkpoint(
    path_or_run_dir: Any,
    *,
    model: Any = None,
    optimizer: Any = None,
    scheduler: Any = None,
    restore_rng: bool = True,
    extras: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Load a checkpoint into the given objects and return its trainer_state (with "step" added).

    path_or_run_dir: a RunDir, a run directory, its checkpoints/ folder, or one step_* folder.
    RNG states (python, numpy, torch CPU, CUDA) are restored exactly when restore_rng. The model
    folder is `<checkpoint>/model` (`load_policy` can also load it directly: it is a HF folder).
    """
    ckpt = _resolve(path_or_run_dir)
    meta = _read(ckpt, ckpt / "meta.json", _json_file(dict))
    for name in meta.get("files", []) if isinstance(meta.get("files"), list) else []:
        if not (ckpt / str(name)).exists():
            raise _damaged(ckpt, ckpt / str(name), "is missing (its meta.json lists it)")
    state = _read(ckpt, ckpt / "trainer_state.json", _json_file(dict))  # read first: damage found before loading
    rng_js = _read(ckpt, ckpt / "rng.json", _json_file(dict)) if restore_rng and (ckpt / "rng.json").exists() else None
    rng_tensors = _read(ckpt, ckpt / "rng.pt", _torch_file) if rng_js is not None else None
    if model is not None and (is_sharded_module(model) or (optimizer is not None and (ckpt / SHARDED_DIR).is_dir()
                                                     and not (ckpt / "optimizer.pt").exists())):
        load_sharded_state(ckpt, model, optimizer)  # a sharded learner's, or a sharded run resumed by one process
        model, optimizer = None, None
    if model is not None:
        _load_model_weights(model, ckpt / "model")
    if optimizer is not None:
        if not (ckpt / "optimizer.pt").exists():
            raise FileNotFoundError(f"{ckpt}: no optimizer.pt (saved without an optimizer)")
        optimizer.load_state_dict(_read(ckpt, ckpt / "optimizer.pt", _torch_file))
    if scheduler is not None:
        if not (ckpt / "scheduler.pt").exists():
            raise FileNotFoundError(f"{ckpt}: no scheduler.pt (saved without a scheduler)")
        scheduler.load_state_dict(_read(ckpt, ckpt / "scheduler.pt", _torch_file))
    for name, obj in (extras or {}).items():
        if not (ckpt / f"{name}.pt").exists():
            raise FileNotFoundError(f"{ckpt}: no {name}.pt (the run was saved without a {name}; resume it with "
                                    "the config it was started with)")
        obj.load_state_dict(_read(ckpt, ckpt / f"{name}.pt", _torch_file))
    if rng_js is not None:
        try:
            _set_rng_state(rng_js, rng_tensors)
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise _damaged(ckpt, ckpt / "rng.json", f"does not hold RNG states ({type(exc).__name__}: {exc})") from exc
    state.setdefault("step", meta.get("step", _step_of(ckpt)))
    state.setdefault("checkpoint_path", str(ckpt))
    return state


def _step_of(ckpt: Path) -> int:
    return int(ckpt.name.split("_")[1])


def resume_checkpoint(run_dir: Any, *, fallback: bool = True, say=None, **objects: Any) -> dict[str, Any]:
    """load_checkpoint(run_dir, **objects) of a run being resumed, from its newest complete checkpoint. When
    that one is damaged (CheckpointDamaged) and an earlier complete one exists: with `fallback`, the damaged
    folder is moved aside to `step_N.damaged` (kept for inspection), `latest` names the earlier one, `say`
    gets a line saying so, and the earlier one is loaded (everything it holds replaces what the damaged one
    had loaded); without, CheckpointDamaged says how to do that by hand (a sharded run's ranks each read
    their own files, so rank 0 alone must not decide). No earlier one: CheckpointDamaged saying so."""
    ckpt = _resolve(run_dir)
    while True:
        try:
            return load_checkpoint(ckpt, **objects)
        except CheckpointDamaged as exc:
            earlier = [p for p in list_checkpoints(ckpt.parent) if _step_of(p) < _step_of(ckpt)]
            if not earlier:
                raise CheckpointDamaged(
                    f"{exc}; there is no earlier complete checkpoint to resume from: restore the file, or start the "
                    "run over (run.overwrite=true)", path=exc.path, file=exc.file) from exc
            prev = earlier[-1]
            if not fallback:
                raise CheckpointDamaged(
                    f"{exc}; the previous complete checkpoint is {prev.name}: to resume from it, move the damaged one "
                    f"aside (mv {ckpt} {ckpt}.damaged) and resume again", path=exc.path, file=exc.file) from exc
            aside = _move_aside(ckpt)
            write_text_atomic(ckpt.parent / "latest", prev.name + "\n")
            if say is not None:
                say(f"warning: {exc}; moved it aside to {aside} and resuming from the previous complete "
                    f"checkpoint, {prev.name} (step {_step_of(prev)})")
            ckpt = prev


def _move_aside(ckpt: Path) -> Path:
    aside, n = ckpt.with_name(ckpt.name + ".damaged"), 1
    while aside.exists():
        n += 1
        aside = ckpt.with_name(f"{ckpt.name}.damaged-{n}")
    os.rename(ckpt, aside)
    _fsync_dir(ckpt.parent)
    return aside
