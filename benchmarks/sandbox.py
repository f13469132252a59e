"""Sandbox throughput: candidates per second for trivial programs, through the rewards batch
scorer (`score_batch("code", ..., workers=k)`: a thread pool dispatching sandbox runs; each
candidate is its own sandboxed process group, so threads are enough).

    .venv/bin/python benchmarks/sandbox.py [--n 40] [--workers 1,2,4]

Prints a table and writes benchmarks/results/sandbox.md and sandbox.json. The machine's load
average is recorded with the figures: on a shared 2-core machine it moves them a lot.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from rlvr.rewards import score_batch
from rlvr.rewards.code.sandbox import isolation
from rlvr.rewards.types import SimpleExample

CASES = {
    # name: (meta, program). Every candidate must score 1.0 (checked), so the figure is for
    # complete, passing runs.
    "io_1test": ({"tests": {"io": [{"stdin": "41\n", "stdout": "42\n"}]}}, "print(int(input()) + 1)\n"),
    "calls_5tests": ({"entry_point": "inc", "tests": {"calls": [{"args": [i], "expected": i + 1} for i in range(5)]}},
                     "def inc(x):\n    return x + 1\n"),
    "asserts_3tests": ({"entry_point": "inc", "tests": {"asserts": [f"assert inc({i}) == {i + 1}" for i in range(3)]}},
                       "def inc(x):\n    return x + 1\n"),
}


def run(n: int, workers: list[int]) -> list[dict]:
    rows = []
    for name, (meta, code) in CASES.items():
        ex = SimpleExample("", meta)
        responses = [f"```python\n{code}```"] * n
        score_batch("code", responses[:2], [ex] * 2, workers=2)  # warm-up (imports, first slot)
        for w in workers:
            load0 = os.getloadavg()[0]
            t0 = time.perf_counter()
            rewards = score_batch("code", responses, [ex] * n, workers=w)
            dt = time.perf_counter() - t0
            assert all(r.total == 1.0 for r in rewards), [r.info for r in rewards if r.total != 1.0][:3]
            rows.append({"case": name, "workers": w, "candidates": n, "seconds": round(dt, 3),
                         "candidates_per_s": round(n / dt, 2), "ms_per_candidate": round(1000 * dt / n, 1),
                         "loadavg_1m_before": round(load0, 2)})
            print(f"{name:16s} workers={w}  {n / dt:7.2f} cand/s  {1000 * dt / n:7.1f} ms/cand  "
                  f"(load {load0:.1f})", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=40, help="candidates per configuration")
    ap.add_argument("--workers", default="1,2,4", help="comma-separated thread counts")
    ap.add_argument("--results-dir", type=Path, default=Path(__file__).parent / "results",
                    help="where sandbox.{json,md} go")
    args = ap.parse_args(argv)
    workers = [int(w) for w in args.workers.split(",")]
    iso = isolation()
    rows = run(args.n, workers)
    meta = {"cpus": os.cpu_count(), "python": platform.python_version(), "root": iso.root,
            "landlock_abi": iso.landlock_abi, "isolation": iso.notes,
            "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
    out = args.results_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "sandbox.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = ["# Sandbox throughput", "",
             f"{meta['date_utc']} UTC, {meta['cpus']} CPUs, Python {meta['python']}, root={iso.root}, "
             f"Landlock ABI {iso.landlock_abi}. Trivial passing programs through `score_batch('code')`.", "",
             "| case | workers | candidates | seconds | candidates/s | ms/candidate | load avg before |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['case']} | {r['workers']} | {r['candidates']} | {r['seconds']} | {r['candidates_per_s']} | "
              f"{r['ms_per_candidate']} | {r['loadavg_1m_before']} |" for r in rows]
    (out / "sandbox.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'sandbox.md'} and {out / 'sandbox.json'}")


if __name__ == "__main__":
    main()
