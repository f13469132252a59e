"""Offline distillation: `rlvr distill` and `distill(cfg: DistillConfig)` (docs/distillation.md).

    teacher  = load_policy(teacher.model)                     # any folder, run directory, checkpoint or hub id
    for each chunk of traces.problems_per_call training problems:
        rollouts = teacher_engine.generate(prompts, SamplingSpec.for_task(task, sampling, n=traces.samples))
        rewards  = score_rollouts(rollouts, problems, task.reward_fn)      # the task's checker, never raises
        kept    += select_verified(rollouts, rewards, max_per_question, dedup)   # (rlvr.train.ei)
    RUN/traces.jsonl  <- {"prompt", "response", "id"} of the kept answers (the prompt the teacher answered)
    RUN/student/      <- rlvr.train.sft.train_sft(data.sft_path=RUN/traces.jsonl): the student's SFT run

The lecture's recipe (R1 and Qwen3 distil a large reasoning model into small ones; "imitation may recover most
of the benefit"): rejection-sampled teacher traces, then SFT. The teacher and student need not share a
tokenizer (the traces are text). On-policy distillation, where the student samples and the teacher scores each
token, is `rlvr train teacher.model=...` (rlvr.train.pg.reference.load_teacher).

Resume: a run directory whose traces.json records the same teacher and trace settings reuses its traces.jsonl
(no teacher is loaded) and the student's SFT continues from its last checkpoint.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rlvr.config import ConfigError, to_dict
from rlvr.data import get_task, write_jsonl
from rlvr.rewards.batch import score_rollouts
from rlvr.rollout.types import SamplingSpec
from rlvr.runs.progress import Progress
from rlvr.runtime import set_num_threads
from rlvr.train import session
from rlvr.train.config import DistillConfig
from rlvr.train.ei import select_verified
from rlvr.train.policy import load_model_at, quiet_transformers
from rlvr.train.session import TrainResult, say, step_seed
from rlvr.train.sft import train_sft
from rlvr.train.tasks import TaskDataError, check_data_files, load_task_data

TRACES, REPORT = "traces.jsonl", "traces.json"


@dataclass
class DistillResult:
    """What `rlvr distill` made: the traces (and their report) and the student's SFT run."""

    traces: Path
    report: dict[str, Any]
    student: TrainResult


def _settings(cfg: DistillConfig) -> dict[str, Any]:
    """What the traces depend on: a resumed run reuses its traces only when these are unchanged."""
    return {"teacher": to_dict(cfg.teacher), "data": to_dict(cfg.data), "sampling": to_dict(cfg.sampling),
            "traces": to_dict(cfg.traces), "seed": cfg.run.seed}


def _teacher(cfg: DistillConfig):
    """(model, tokenizer, the folder or hub id it came from) of teacher.model; ConfigError naming the key."""
    t = cfg.teacher
    model, tok, where = load_model_at(t.model, dtype=t.dtype or cfg.model.dtype, device=t.device or cfg.model.device,
                                      key="teacher.model")
    return model.eval(), tok, where


def write_traces(cfg: DistillConfig, out: Path) -> dict[str, Any]:
    """Sample the teacher on every training problem, keep the verified answers, write out/traces.jsonl and
    out/traces.json (the report); returns the report."""
    tr = cfg.traces
    try:
        check_data_files(cfg.data, train=True)
        task = load_task_data(replace(cfg.data, num_eval=0, eval_path=""), None, train=True)
    except TaskDataError:
        raise
    except (ValueError, KeyError, OSError) as exc:
        raise ConfigError(str(exc)) from None
    problems = list(task.train)
    if not problems:
        raise ConfigError(f"data: task {cfg.data.task!r} has no training problems for the teacher to answer")
    set_num_threads(cfg.run.num_threads or None)
    quiet_transformers()
    say(f"loading teacher {cfg.teacher.model} ...")
    teacher, tok, source = _teacher(cfg)
    template = task.template
    reg_task = get_task(cfg.data.task)
    prompt = (lambda ex: reg_task.prompt(ex, template, tok)) if template else task.prompt
    engine = session.sampler(cfg.rollout, teacher, tok, model_source=source, seed=cfg.run.seed,
                             batch_size=tr.problems_per_call * tr.samples)
    rows: list[dict[str, Any]] = []
    counts = {"problems": len(problems), "samples": 0, "verified": 0, "solved": 0, "duplicates": 0, "capped": 0}
    t0 = time.perf_counter()
    with Progress(total=len(problems), description="teacher traces", stream=sys.stderr,
                  mode=None if cfg.run.progress else "off") as bar:
        for start in range(0, len(problems), tr.problems_per_call):
            chunk = problems[start:start + tr.problems_per_call]
            prompts = [prompt(ex) for ex in chunk]
            spec = SamplingSpec.for_task(task, cfg.sampling, seed=step_seed(cfg.run.seed, start), n=tr.samples,
                                         logprobs=False)
            rollouts = engine.generate(prompts, spec)
            examples = [chunk[ro.group] for ro in rollouts]
            rewards = score_rollouts(rollouts, examples, task.reward_fn, workers=cfg.data.reward_workers,
                                     timeout_s=cfg.data.reward_timeout_s, isolate=cfg.data.reward_isolate)
            if tr.keep_unverified:
                kept = list(range(len(rollouts)))
            else:
                sel = select_verified(rollouts, rewards, max_per_question=tr.max_per_question, dedup=tr.dedup,
                                      questions=len(chunk))
                kept = sel.kept
                counts["verified"] += sel.verified
                counts["solved"] += sel.solved
                counts["duplicates"] += sel.duplicates
                counts["capped"] += sel.capped
            counts["samples"] += len(rollouts)
            for i in kept:
                ro, ex = rollouts[i], chunk[rollouts[i].group]
                rows.append({"prompt": prompts[ro.group], "response": ro.text, "id": str(ex.id),
                             "teacher_status": rewards[i].status.value})
            bar.update(len(chunk))
    del engine, teacher
    gc.collect()
    if not rows:
        raise ConfigError(f"the teacher ({cfg.teacher.model}) answered none of the {len(problems)} training problems "
                          "correctly: nothing to distil (a stronger teacher, more traces.samples, or "
                          "traces.keep_unverified=true)")
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / TRACES, rows)
    counts["kept"] = len(rows)
    report = {"settings": _settings(cfg), "counts": counts, "teacher_source": source,
              "time": {"sampling_s": time.perf_counter() - t0}}
    (out / REPORT).write_text(json.dumps(report, indent=1), encoding="utf-8")
    solved = f", {counts['solved']} of {len(problems)} problems solved" if not tr.keep_unverified else ""
    print(f"traces: kept {len(rows)} of {counts['samples']} teacher answers{solved} -> {out / TRACES}")
    return report


def distill(cfg: DistillConfig, *, resume: bool = False) -> DistillResult:
    """Write the teacher's traces (or reuse them on resume) and fine-tune the student on them (module docstring).
    Raises ConfigError / TaskDataError on bad input before any model loads, and when nothing was kept."""
    cfg.validate()
    out = Path(cfg.run.out_dir)
    report_path = out / REPORT
    report = None
    if report_path.exists() and (out / TRACES).exists():
        old = json.loads(report_path.read_text())
        if old.get("settings") == json.loads(json.dumps(_settings(cfg))) and (resume or not cfg.run.overwrite):
            report = old
            say(f"traces: reusing {out / TRACES} ({old['counts']['kept']} answers of {old['teacher_source']})")
        elif not cfg.run.overwrite and not resume:
            raise ConfigError(f"run.out_dir={cfg.run.out_dir} holds traces of other settings: set run.overwrite=true "
                              "to replace them, or choose another run.out_dir")
    elif out.exists() and any(out.iterdir()) and not (cfg.run.overwrite or resume):
        raise ConfigError(f"run.out_dir={cfg.run.out_dir} exists and is not empty: set run.overwrite=true, or choose "
                          "another run.out_dir")
    if report is None:
        report = write_traces(cfg, out)
    sft_cfg = cfg.sft_config(str(out / TRACES))
    student_resume = resume and (Path(sft_cfg.run.out_dir) / "checkpoints").exists()
    student = train_sft(sft_cfg, resume=student_resume)
    return DistillResult(traces=out / TRACES, report=report, student=student)
