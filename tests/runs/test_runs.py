"""rlvr.runs: run directory, metrics/samples, resume truncation, atomic checkpoints, RNG, progress, plots."""

from __future__ import annotations

import io
import math
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO

from rlvr.runs import (
    Progress,
    RunDir,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    metric_series,
    plot_run,
    read_jsonl,
    save_checkpoint,
)

# ------------------------------------------------------------------------------------ run dir


def test_create_log_and_read(tmp_path):
    with RunDir.create(tmp_path / "r", config={"optim": {"lr": 1e-3}}, tensorboard=False) as run:
        row = run.log_metrics(1, {"loss": torch.tensor(0.5), "accuracy": np.float32(0.25), "kl": float("nan")})
        run.log_metrics(2, {"loss": 0.25, "n": 3}, time_s=7.0)
        run.log_samples(1, [{"prompt": "1+1=", "response": "2", "parts": {"answer": 1.0}, "status": "correct"}])
    assert row["loss"] == 0.5 and row["accuracy"] == 0.25
    assert row["kl"] is None  # NaN is not JSON: stored as null, shown as a gap in plots
    rows = read_jsonl(tmp_path / "r" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[1] == {"step": 2, "time": 7.0, "loss": 0.25, "n": 3}
    assert 0.0 <= rows[0]["time"] < 60
    samples = read_jsonl(tmp_path / "r" / "samples.jsonl")
    assert samples == [{"step": 1, "prompt": "1+1=", "response": "2", "parts": {"answer": 1.0}, "status": "correct"}]
    assert (tmp_path / "r" / "config.yaml").read_text().startswith("optim:")
    assert metric_series(rows, "loss") == ([1.0, 2.0], [0.5, 0.25])
    assert metric_series(rows, "kl") == ([], [])


def test_create_refuses_existing_run_unless_overwritten(tmp_path):
    RunDir.create(tmp_path / "r", tensorboard=False).close()
    with pytest.raises(FileExistsError, match="already holds a run"):
        RunDir.create(tmp_path / "r", tensorboard=False)
    (tmp_path / "r" / "checkpoints" / "step_000001").mkdir(parents=True)
    run = RunDir.create(tmp_path / "r", tensorboard=False, exist_ok=True)
    assert not (tmp_path / "r" / "checkpoints" / "step_000001").exists()
    run.close()


def test_default_path_has_name_and_timestamp(tmp_path):
    run = RunDir.create(root=tmp_path, name="grpo demo", tensorboard=False)
    other = RunDir.create(root=tmp_path, name="grpo demo", tensorboard=False)
    assert run.path.parent == tmp_path and run.path.name.startswith("grpo_demo-2")
    assert other.path != run.path  # same second: a suffix keeps them apart
    run.close()
    other.close()


def test_resume_truncates_to_checkpoint_and_carries_time(tmp_path):
    # An interrupted run logged steps 1..5 (time 10 s per step) and a torn half line, but its last
    # checkpoint is step 3: the resumed run must see exactly rows 1..3 and continue at time 30.
    path = tmp_path / "r"
    with RunDir.create(path, tensorboard=False) as run:
        for s in range(1, 6):
            run.log_metrics(s, {"loss": 1.0 / s}, time_s=10.0 * s)
            run.log_samples(s, [{"response": f"r{s}"}])
    with open(path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "lo')  # killed mid-write
    run = RunDir.resume(path, 3, tensorboard=False)
    assert [r["step"] for r in run.read_metrics()] == [1, 2, 3]
    assert [r["response"] for r in run.read_samples()] == ["r1", "r2", "r3"]
    assert 30.0 <= run.elapsed() < 40.0
    row = run.log_metrics(4, {"loss": 0.2})
    assert 30.0 <= row["time"] < 40.0
    run.close()
    assert [r["step"] for r in read_jsonl(path / "metrics.jsonl")] == [1, 2, 3, 4]


def test_read_jsonl_reports_bad_middle_line(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"m.jsonl:2: invalid JSON"):
        read_jsonl(p)


def test_reserved_metric_names(tmp_path):
    with RunDir.create(tmp_path / "r", tensorboard=False) as run, pytest.raises(ValueError, match="reserved"):
        run.log_metrics(1, {"step": 3})


def test_tensorboard_events_written_and_purged_on_resume(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path = tmp_path / "r"
    with RunDir.create(path) as run:
        for s in range(1, 5):
            run.log_metrics(s, {"loss": float(s)})
    with RunDir.resume(path, 2) as run:
        run.log_metrics(3, {"loss": 30.0})
    acc = EventAccumulator(str(path / "tb"))
    acc.Reload()
    events = [(e.step, e.value) for e in acc.Scalars("loss")]
    # steps 3 and 4 of the first attempt are purged; the resumed step 3 replaces them
    assert events == [(1, 1.0), (2, 2.0), (3, 30.0)]


# --------------------------------------------------------------------------------- checkpoints


def _tiny_lm():
    from rlvr.models.tiny import build_tiny_model

    return build_tiny_model(hidden_size=16, num_layers=1, num_heads=2, seed=0, tie_word_embeddings=True)


def _train_steps(model, opt, sched, n, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x = torch.randn(4, 3, generator=g)
        loss = (model(x) ** 2).mean() + 0.01 * torch.rand(()).item()  # global RNG used too
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


def _linear():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return model, opt, sched


def test_checkpoint_restores_model_optimizer_scheduler_exactly(tmp_path):
    # Uninterrupted: 4 steps. Interrupted: 2 steps, save, fresh objects, load, 2 more steps.
    # AdamW moments and the scheduler position matter: without them the weights would differ.
    model, opt, sched = _linear()
    _train_steps(model, opt, sched, 2, seed=1)
    save_checkpoint(tmp_path, 2, model=model, optimizer=opt, scheduler=sched, trainer_state={"pos": 8})
    _train_steps(model, opt, sched, 2, seed=2)
    expected = [p.detach().clone() for p in model.parameters()]

    model2, opt2, sched2 = _linear()
    torch.nn.init.zeros_(model2.weight)
    state = load_checkpoint(tmp_path, model=model2, optimizer=opt2, scheduler=sched2)
    assert state["pos"] == 8 and state["step"] == 2
    assert sched2.last_epoch == 2
    _train_steps(model2, opt2, sched2, 2, seed=2)
    for a, b in zip(expected, model2.parameters(), strict=True):
        assert torch.equal(a, b)


def test_rng_states_restored_exactly(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    model = torch.nn.Linear(2, 2)
    save_checkpoint(tmp_path, 5, model=model)
    draws = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    load_checkpoint(tmp_path, model=model)
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert draws[0] == again[0] and draws[1] == again[1] and torch.equal(draws[2], again[2])
    # restore_rng=False leaves the current streams alone
    random.seed(7)
    load_checkpoint(tmp_path, model=model, restore_rng=False)
    assert random.random() == random.Random(7).random()


def test_hf_model_round_trip_with_tied_embeddings(tmp_path, capfd):
    model, tok = _tiny_lm()
    ids = torch.tensor([tok.encode("12+3=15")])
    logits = model(ids).logits
    capfd.readouterr()
    ckpt = save_checkpoint(tmp_path, 1, model=model, tokenizer=tok, trainer_state={})
    assert "Writing model shards" not in capfd.readouterr().err  # no tqdm noise per checkpoint
    assert (ckpt / "model" / "config.json").exists() and (ckpt / "model" / "tokenizer.json").exists()
    other, _ = _tiny_lm()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    load_checkpoint(ckpt, model=other)
    assert torch.equal(other(ids).logits, logits)
    # the model folder is a normal HF folder
    from rlvr.models.loading import load_policy

    loaded, tok2 = load_policy(ckpt / "model")
    assert tok2.decode(tok2.encode("12 + 3")) == "12 + 3"
    assert torch.equal(loaded(ids).logits, logits)


def test_mismatched_model_is_an_error(tmp_path):
    model, _ = _tiny_lm()
    save_checkpoint(tmp_path, 1, model=model)
    from rlvr.models.tiny import build_tiny_model

    bigger, _ = build_tiny_model(hidden_size=16, num_layers=2, num_heads=2, seed=0)
    with pytest.raises(RuntimeError, match="does not match the model: missing"):
        load_checkpoint(tmp_path, model=bigger)


def test_keep_last_k_and_latest_pointer(tmp_path):
    model = torch.nn.Linear(2, 2)
    for s in (10, 20, 30, 40):
        save_checkpoint(tmp_path, s, model=model, trainer_state={"s": s}, keep=2)
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert names == ["step_000030", "step_000040"]
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step_000040"
    # re-saving an existing step after a resume replaces it
    save_checkpoint(tmp_path, 30, model=model, trainer_state={"s": "again"}, keep=0)
    assert load_checkpoint(tmp_path / "checkpoints" / "step_000030", model=model)["s"] == "again"
    assert latest_checkpoint(tmp_path).name == "step_000030"
    # a pointer to a folder that is gone falls back to the newest complete checkpoint
    (tmp_path / "checkpoints" / "latest").write_text("step_000099\n")
    assert latest_checkpoint(tmp_path).name == "step_000040"
    assert load_checkpoint(tmp_path, model=model)["s"] == 40


def test_bad_trainer_state_and_missing_checkpoint(tmp_path):
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="JSON-able"):
        save_checkpoint(tmp_path, 1, model=model, trainer_state={"x": object()})
    assert list_checkpoints(tmp_path) == []
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        load_checkpoint(tmp_path, model=model)


def test_checkpoint_with_extras_points_latest_at_its_step(tmp_path):
    model, extra = torch.nn.Linear(2, 2), torch.nn.Linear(1, 1)
    save_checkpoint(tmp_path, 3, model=model, extras={"critic": extra})
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step_000003"
    save_checkpoint(tmp_path, 3, model=model, extras={"critic": extra})  # re-saving a step swaps the folder
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000003"]
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".tmp")]


def test_exception_mid_save_keeps_previous(tmp_path):
    model, opt, _ = _linear()
    save_checkpoint(tmp_path, 1, model=model, optimizer=opt, trainer_state={"s": 1})

    class Boom:
        def state_dict(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(tmp_path, 2, model=model, optimizer=Boom(), trainer_state={"s": 2})
    assert [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name != "latest"] == ["step_000001"]
    assert load_checkpoint(tmp_path, model=model)["s"] == 1


def test_process_killed_mid_save_keeps_previous_checkpoint(tmp_path):
    # A child process saves step 1, then dies (os._exit, no cleanup) while writing step 2's
    # optimizer file. The previous checkpoint and the `latest` pointer must survive intact.
    script = textwrap.dedent(
        f"""
        import os, torch
        from rlvr.runs import save_checkpoint
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        save_checkpoint({str(tmp_path)!r}, 1, model=model, optimizer=opt, trainer_state={{"s": 1}})
        torch.save(model.state_dict(), {str(tmp_path / "w1.pt")!r})
        with torch.no_grad():
            model.weight.add_(1.0)
        real_save = torch.save
        def dying_save(obj, f, *a, **k):
            if str(f).endswith("optimizer.pt"):
                os._exit(17)
            return real_save(obj, f, *a, **k)
        torch.save = dying_save
        save_checkpoint({str(tmp_path)!r}, 2, model=model, optimizer=opt, trainer_state={{"s": 2}})
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 17, proc.stderr
    ckpts = tmp_path / "checkpoints"
    assert any(p.name.startswith(".tmp-step_000002") for p in ckpts.iterdir())  # the torn write
    assert (ckpts / "latest").read_text().strip() == "step_000001"
    model = torch.nn.Linear(3, 2)
    state = load_checkpoint(tmp_path, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert state["s"] == 1 and state["step"] == 1
    w1 = torch.load(tmp_path / "w1.pt")
    assert torch.equal(model.weight, w1["weight"])
    # the next save removes the leftover temp folder
    save_checkpoint(tmp_path, 2, model=model, trainer_state={"s": 2})
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_000001", "step_000002"]


# ------------------------------------------------------------------------------------ progress


def test_progress_plain_mode_prints_periodic_lines_without_escape_codes():
    out = io.StringIO()  # not a TTY
    with Progress(total=10, description="grpo", stream=out, log_every=4) as bar:
        assert bar.mode == "plain"
        for i in range(10):
            bar.update(1, reward=0.1 * i, loss=1e-5, acc=0.5)
    lines = out.getvalue().splitlines()
    # printed at 4, 8 and at the end (10): three lines, fields as of that step
    assert [ln.split()[1] for ln in lines] == ["4/10", "8/10", "10/10"]
    assert lines[0].startswith("grpo 4/10 (40%)")
    assert lines[0].endswith("reward=0.3 loss=1e-05 acc=0.5")
    assert "\x1b" not in out.getvalue()


def test_progress_resumed_start_and_modes(monkeypatch):
    out = io.StringIO()
    bar = Progress(total=6, description="sft", stream=out, start=4, log_every=100)
    bar.update(2, loss=0.5)
    bar.close()
    assert out.getvalue().splitlines() == [out.getvalue().splitlines()[0]]
    assert out.getvalue().startswith("sft 6/6 (100%)")
    off = io.StringIO()
    with Progress(total=3, stream=off, mode="off") as bar:
        bar.update(3, loss=1.0)
    assert off.getvalue() == ""
    monkeypatch.setenv("RLVR_PROGRESS", "rich")
    rich_out = io.StringIO()
    with Progress(total=3, description="x", stream=rich_out) as bar:
        assert bar.mode == "rich"
        bar.update(3, loss=1.0)
    assert "3/3" in rich_out.getvalue()
    with pytest.raises(ValueError, match="known: rich, plain, off"):
        Progress(total=1, mode="fancy")


# --------------------------------------------------------------------------------------- plots


def _fake_metrics(run: RunDir, n: int = 30) -> None:
    for s in range(1, n + 1):
        acc = min(1.0, s / n)
        run.log_metrics(
            s,
            {
                "reward/mean": acc + 0.1, "reward/format": 1.0, "accuracy": acc, "format_rate": 0.9,
                "loss": 1 / s, "grad_norm": 2.0, "entropy": 1.5 - acc, "kl": 0.01 * s,
                "clip_frac/low": 0.01, "clip_frac/high": 0.02, "len/mean": 10 + s % 3,
                "len/correct": 9.0, "len/incorrect": 12.0, "tokens_per_s": 1000.0 + s,
                "time/generate": 0.5, "verifier/timeouts": 0, "custom_thing": math.sin(s),
            },
            time_s=2.0 * s,
        )
        if s % 10 == 0:
            run.log_metrics(s, {"eval/accuracy": acc}, time_s=2.0 * s)


def test_plot_run_writes_the_present_figures(tmp_path):
    with RunDir.create(tmp_path / "r", tensorboard=False) as run:
        _fake_metrics(run)
    paths = plot_run(tmp_path / "r")
    names = [p.name for p in paths]
    assert names == ["reward.png", "reward_time.png", "length.png", "optimization.png", "system.png", "other.png"]
    for p in paths:
        assert p.parent == tmp_path / "r" / "plots"
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000


def test_plot_run_only_what_exists_and_cli(tmp_path):
    from typer.testing import CliRunner

    from rlvr.cli import app

    with RunDir.create(tmp_path / "r", tensorboard=False) as run:
        run.log_metrics(1, {"loss": 2.0})
        run.log_metrics(2, {"loss": 1.0})
    (tmp_path / "r" / "plots").mkdir()
    (tmp_path / "r" / "plots" / "reward.png").write_bytes(b"stale")  # from an earlier plot call
    # typer runs a one-command app without the subcommand name (until others register theirs)
    cmd = ["plot"] if len(app.registered_commands) > 1 else []
    assert any(c.callback.__name__ == "plot" for c in app.registered_commands)
    result = CliRunner().invoke(app, [*cmd, str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in (tmp_path / "r" / "plots").iterdir())
    assert written == ["optimization.png"]
    # each figure's path, then what it draws
    assert result.output.splitlines() == [str(tmp_path / "r" / "plots" / "optimization.png"), "  Loss: loss"]
    missing = CliRunner().invoke(app, [*cmd, str(tmp_path / "nope")])
    assert missing.exit_code == 2
    assert "metrics.jsonl does not exist" in missing.output


def test_resume_from_an_earlier_checkpoint_drops_later_ones(tmp_path):
    # Resuming at step 20 abandons what came after it: the step-30 checkpoint must not survive to
    # be picked by `latest` or by keep-last-k pruning of the new continuation.
    model = torch.nn.Linear(2, 2)
    with RunDir.create(tmp_path / "r", tensorboard=False) as run:
        for s in (10, 20, 30):
            run.log_metrics(s, {"loss": 1.0})
            save_checkpoint(run, s, model=model, trainer_state={"s": s}, keep=0)
    with RunDir.resume(tmp_path / "r", 20, tensorboard=False) as run:
        assert [p.name for p in list_checkpoints(run)] == ["step_000010", "step_000020"]
        assert latest_checkpoint(run).name == "step_000020"
        assert [r["step"] for r in run.read_metrics()] == [10, 20]


def test_without_tensorboard_one_info_line_and_no_events(tmp_path, monkeypatch, caplog):
    import logging

    import rlvr.runs.rundir as rundir_mod

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import now raises ImportError
    monkeypatch.setattr(rundir_mod, "_TB_NOTICE_SHOWN", False)
    with caplog.at_level(logging.INFO, logger="rlvr.runs.rundir"):
        for name in ("a", "b"):
            with RunDir.create(tmp_path / name) as run:
                run.log_metrics(1, {"loss": 1.0})
    notices = [r for r in caplog.records if "tensorboard is not installed" in r.getMessage()]
    assert len(notices) == 1
    assert not (tmp_path / "a" / "tb").exists()
    assert read_jsonl(tmp_path / "a" / "metrics.jsonl")[0]["loss"] == 1.0


class _Crash(Exception):
    pass


def _toy_run(path: Path, steps: int, *, resume: bool = False, crash_after: int | None = None) -> None:
    """A miniature trainer: global-RNG data (torch, numpy, python), AdamW + schedule, metrics every
    step, a checkpoint every 2 steps. crash_after=k dies after logging step k (k odd: the last
    checkpoint is k-1, so metrics.jsonl holds one row past it that resume must drop)."""
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    model, opt, sched = _linear()
    start = 0
    if resume:
        start = load_checkpoint(path, model=model, optimizer=opt, scheduler=sched)["step"]
        run = RunDir.resume(path, start, tensorboard=False)
    else:
        run = RunDir.create(path, tensorboard=False)
    with run:
        for step in range(start + 1, steps + 1):
            x = torch.randn(8, 3) + float(np.random.rand()) + random.random()
            loss = (model(x) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            run.log_metrics(step, {"loss": loss, "w0": model.weight[0, 0]})
            if step % 2 == 0:
                save_checkpoint(run, step, model=model, optimizer=opt, scheduler=sched, trainer_state={})
            if crash_after == step:
                raise _Crash
    torch.save(model.state_dict(), path / "final.pt")


def test_toy_loop_resumed_after_crash_equals_uninterrupted(tmp_path):
    _toy_run(tmp_path / "a", 8)
    with pytest.raises(_Crash):
        _toy_run(tmp_path / "b", 8, crash_after=5)  # checkpoint 4 exists; step 5 was logged, then lost
    _toy_run(tmp_path / "b", 8, resume=True)

    def strip(rows):
        return [{k: v for k, v in r.items() if k != "time"} for r in rows]

    a, b = read_jsonl(tmp_path / "a" / "metrics.jsonl"), read_jsonl(tmp_path / "b" / "metrics.jsonl")
    assert [r["step"] for r in b] == list(range(1, 9))
    assert strip(a) == strip(b)  # bit-identical losses and weights at every step
    wa, wb = torch.load(tmp_path / "a" / "final.pt"), torch.load(tmp_path / "b" / "final.pt")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
