"""Benchmark of `rlvr demo` (README's first command): run the real CLI, time it, and record the
before/after table and the acceptance targets (greedy +15 points, sampled +8 points, < 5 minutes).

    .venv/bin/python benchmarks/demo.py [--threads 1] [--out runs/bench-demo] [extra key=value ...]

Writes benchmarks/results/demo.json and demo.md. The machine's load average is recorded with the
timing: on a shared machine wall time is pessimistic.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
TARGETS = {"greedy_points": 15.0, "sampled_points": 8.0, "seconds": 300.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench-demo"))
    ap.add_argument("--extra-seeds", type=int, nargs="*", default=[1, 2],
                    help="Also run these seeds (robustness rows; the headline is the default seed 0).")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    load_before = os.getloadavg()
    env = {**os.environ, "RLVR_PROGRESS": "off"}
    cmd = [sys.executable, "-m", "rlvr.cli", "demo", f"out_dir={a.out}", "--threads", str(a.threads), *a.overrides]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    load_after = os.getloadavg()
    if proc.returncode != 0:
        sys.exit(f"rlvr demo failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    summary = json.loads((Path(a.out) / "demo.json").read_text())
    b, f = summary["before"], summary["after"]
    result = {
        "command": " ".join(["rlvr", *cmd[3:]]),
        "wall_seconds_including_startup": round(wall, 1),
        "seconds": {k: round(v, 1) for k, v in summary["seconds"].items()},
        "greedy_accuracy": [b["greedy/accuracy"], f["greedy/accuracy"]],
        "sampled_accuracy": [b["sampled/accuracy"], f["sampled/accuracy"]],
        "format_rate_greedy": [b["greedy/format_rate"], f["greedy/format_rate"]],
        "mean_length_greedy": [b["greedy/len/mean"], f["greedy/len/mean"]],
        "delta_greedy_points": round(summary["delta_greedy_points"], 1),
        "delta_sampled_points": round(summary["delta_sampled_points"], 1),
        "targets": TARGETS,
        "meets_targets": summary["delta_greedy_points"] >= TARGETS["greedy_points"]
        and summary["delta_sampled_points"] >= TARGETS["sampled_points"]
        and wall < TARGETS["seconds"],
        "threads": a.threads,
        "cpu_count": os.cpu_count(),
        "load_average_before_after": [round(x, 2) for x in (*load_before, *load_after)],
        "machine": platform.platform(),
        "when_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }
    seeds = []
    for sd in a.extra_seeds:
        out = f"{a.out}-seed{sd}"
        t1 = time.perf_counter()
        p2 = subprocess.run([*cmd[:4], f"out_dir={out}", f"seed={sd}", *cmd[5:]], capture_output=True, text=True,
                            env=env, cwd=ROOT)
        if p2.returncode != 0:
            sys.exit(f"rlvr demo seed={sd} failed:\n{p2.stderr}")
        sm = json.loads((Path(out) / "demo.json").read_text())
        seeds.append({"seed": sd, "wall_seconds": round(time.perf_counter() - t1, 1),
                      "greedy": [sm["before"]["greedy/accuracy"], sm["after"]["greedy/accuracy"]],
                      "sampled": [sm["before"]["sampled/accuracy"], sm["after"]["sampled/accuracy"]],
                      "delta_greedy_points": round(sm["delta_greedy_points"], 1),
                      "delta_sampled_points": round(sm["delta_sampled_points"], 1)})
    result["other_seeds"] = seeds
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "demo.json").write_text(json.dumps(result, indent=1) + "\n")
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f}%"  # None: a format rate without a format part
    md = [
        "# `rlvr demo` benchmark",
        "",
        f"`{result['command']}` on {result['cpu_count']} CPU cores, {a.threads} torch thread(s), "
        f"{result['when_utc']} UTC. Load average (1/5/15 min) before: {load_before[0]:.2f}/{load_before[1]:.2f}/"
        f"{load_before[2]:.2f}, after: {load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f} "
        "(the machine is shared; wall time is pessimistic under load).",
        "",
        "| held-out (200 problems) | after SFT | after GRPO | delta |",
        "|---|---:|---:|---:|",
        f"| greedy accuracy | {pct(b['greedy/accuracy'])} | {pct(f['greedy/accuracy'])} | "
        f"{result['delta_greedy_points']:+.1f} pts (target >= +15) |",
        f"| sampled accuracy (T=1) | {pct(b['sampled/accuracy'])} | {pct(f['sampled/accuracy'])} | "
        f"{result['delta_sampled_points']:+.1f} pts (target >= +8) |",
        f"| format rate (greedy) | {pct(b['greedy/format_rate'])} | {pct(f['greedy/format_rate'])} | |",
        f"| mean length, tokens (greedy) | {b['greedy/len/mean']:.2f} | {f['greedy/len/mean']:.2f} | |",
        "",
        f"Time: total wall {wall:.0f} s including process start-up (target < 300 s); inside the demo: SFT "
        f"{summary['seconds']['sft']:.0f} s, GRPO {summary['seconds']['rl']:.0f} s, evaluation "
        f"{summary['seconds']['eval']:.0f} s. Meets all targets: {'yes' if result['meets_targets'] else 'NO'}.",
        "",
        "Other seeds (robustness; the demo's default is seed 0):",
        "",
        "| seed | greedy after SFT -> after GRPO | sampled after SFT -> after GRPO | wall |",
        "|---|---|---|---:|",
        *[f"| {x['seed']} | {pct(x['greedy'][0])} -> {pct(x['greedy'][1])} ({x['delta_greedy_points']:+.1f} pts) | "
          f"{pct(x['sampled'][0])} -> {pct(x['sampled'][1])} ({x['delta_sampled_points']:+.1f} pts) | "
          f"{x['wall_seconds']:.0f} s |" for x in seeds],
        "",
        "Format rate is n/a here: the demo's arithmetic reward has no format part (docs/runs.md, Evaluation).",
        "",
    ]
    (RESULTS / "demo.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
