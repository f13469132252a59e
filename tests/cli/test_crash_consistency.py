"""Issue 37's crash-consistency standard, kept: `rlvr train` killed at every file-mutating call of one checkpoint
save, and of a resume's own writes, resumes to the uninterrupted run's metrics and weights.

tests/helpers/kill_driver.py runs each command in a forked child of one warm process and kills it (os._exit: no
clean-up, the files as a SIGKILL leaves them) at the N-th file-mutating call of a phase: right after a file is
opened for writing (truncated, nothing written), in the middle of torch.save / the safetensors write (the file
cut to half), before a rename, replace, unlink, mkdir or rmtree. The calls are enumerated by a counting run
first, so a new write in a save is a new kill point without editing this test.

Run (marker cli, about 2-3 min on 2 cores): make test-cli, or pytest -m cli tests/cli/test_crash_consistency.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO, TESTS
from safetensors.torch import load_file

pytestmark = pytest.mark.cli

DRIVER = TESTS / "helpers" / "kill_driver.py"
TINY = [
    "--recipe", "grpo",
    "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
    "data.num_train=40", "data.num_eval=4", "data.digits=1",
    "data.reward=language",  # dense reward: weights and Adam state move every step
    "sampling.n_prompts=2", "sampling.group_size=4", "sampling.max_tokens=4",
    "algo.train_batch_size=4",  # 2 optimizer steps per rollout batch
    "algo.kl_coef=0.05", "algo.ref_refresh_every=2",  # a reference model the resume must rebuild
    "optim.lr=1e-3", "optim.warmup_steps=2", "optim.schedule=cosine",
    "run.steps=6", "run.checkpoint_every=2", "run.log_samples_every=2", "run.progress=false",
    "run.num_threads=1",
]  # fmt: skip
TIMING = ("time", "time/", "tokens_per_s", "mem/", "perf/")


class Driver:
    def __init__(self, logs: Path):
        env = {**os.environ, "PYTHONPATH": str(REPO), "RLVR_NUM_THREADS": "1", "RLVR_PROGRESS": "off"}
        self.proc = subprocess.Popen([sys.executable, str(DRIVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env, cwd=str(logs))
        self.logs, self.n = logs, 0

    def run(self, argv: list[str], **job) -> dict:
        self.n += 1
        log = self.logs / f"job{self.n:03d}.log"
        self.proc.stdin.write(json.dumps({"argv": argv, "log": str(log), **job}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the driver died; see {log}"
        res = json.loads(line)
        res["log"] = log
        return res

    def ok(self, argv: list[str], **job) -> dict:
        res = self.run(argv, **job)
        assert res["status"] == "exit" and res["code"] == 0, f"{argv}: {res}\n{res['log'].read_text()[-3000:]}"
        return res

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    latest = (run / "checkpoints" / "latest").read_text().strip()
    assert latest == "step_000006"
    out: dict[str, torch.Tensor] = {}
    for f in sorted((run / "checkpoints" / latest / "model").glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _same_run(run: Path, ref: Path, what: str, finished_before: bool = False) -> None:
    assert _metrics(run) == _metrics(ref), f"{what}: metrics differ from the uninterrupted run"
    a, b = _weights(run), _weights(ref)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f"{what}: weights differ"
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names[-2:] == ["step_000004", "step_000006"], f"{what}: {names}"
    # a save's leftovers are removed by the next save or resume; a run killed after its last checkpoint was
    # complete has neither (the resume said "nothing to do"): there an old checkpoint being deleted may remain
    leftovers = [n for n in names if n.startswith(".tmp-") and not (finished_before and n.startswith(".tmp-del-"))]
    assert not leftovers, f"{what}: {leftovers}"


def test_killed_at_every_write_of_a_save_and_of_a_resume_resumes_to_the_same_run(tmp_path):
    drv = Driver(tmp_path)
    try:
        ref = tmp_path / "ref"
        drv.ok([*("train", *TINY), f"run.out_dir={ref}"])
        assert len(_metrics(ref)) == 6

        # the state every save-phase case starts from: step 4's checkpoint written (step 2's kept: keep 2), then
        # the process died. Step 6's save is the one killed: it writes a checkpoint and deletes step 2's
        base4 = tmp_path / "base4"
        res = drv.run([*("train", *TINY), f"run.out_dir={base4}"], exit_after_save=4)
        assert res["status"] == "killed", res

        # the writes of step 6's checkpoint save, counted (this resume also checks base4 -> ref)
        counted = tmp_path / "count_save"
        shutil.copytree(base4, counted)
        calls = tmp_path / "save_calls.json"
        drv.ok(["train", "--resume", str(counted)], phase="save:6", kill_at=0, calls_out=str(calls))
        _same_run(counted, ref, "resumed from step 4")
        save_calls = json.loads(calls.read_text())
        kinds = {c[0].split(":")[0] for c in save_calls}
        assert {"open", "torch.save", "serialize_file", "os.rename", "os.replace", "shutil.rmtree"} <= kinds, kinds
        assert len(save_calls) >= 15, save_calls

        # the state every resume-phase case starts from: steps 5 and 6 logged after checkpoint 4, then killed
        # before step 6's checkpoint: the resume cuts the logs back, rewrites config.yaml, ...
        base6 = tmp_path / "base6"
        shutil.copytree(base4, base6)
        res = drv.run(["train", "--resume", str(base6)], exit_before_save=6)
        assert res["status"] == "killed", res
        assert max(r["step"] for r in _metrics(base6)) == 6
        counted = tmp_path / "count_resume"
        shutil.copytree(base6, counted)
        calls = tmp_path / "resume_calls.json"
        drv.ok(["train", "--resume", str(counted)], phase="resume", kill_at=0, calls_out=str(calls))
        _same_run(counted, ref, "resumed from step 4 with later rows logged")
        resume_calls = json.loads(calls.read_text())
        assert any(c[1].startswith("config.yaml") for c in resume_calls), resume_calls  # the config, rewritten
        assert any(c[1].startswith("metrics.jsonl") for c in resume_calls), resume_calls  # the logs, cut back

        failures = []
        for phase, base, n in (("save:6", base4, len(save_calls)), ("resume", base6, len(resume_calls))):
            listed = save_calls if phase == "save:6" else resume_calls
            for k in range(1, n + 1):
                what = f"killed at {phase} call {k} ({' '.join(listed[k - 1])})"
                case = tmp_path / f"{phase.replace(':', '')}_{k:02d}"
                shutil.copytree(base, case)
                res = drv.run(["train", "--resume", str(case)], phase=phase, kill_at=k)
                if res["status"] != "killed":
                    failures.append(f"{what}: not killed ({res})")
                    continue
                res = drv.run(["train", "--resume", str(case)])
                if res["code"] != 0:
                    failures.append(f"{what}: the resume failed: {res['log'].read_text()[-1500:]}")
                    continue
                try:
                    _same_run(case, ref, what, finished_before="nothing to do" in res["log"].read_text())
                except AssertionError as exc:
                    failures.append(str(exc))
                shutil.rmtree(case)
        assert not failures, "\n".join(failures)
    finally:
        drv.close()
