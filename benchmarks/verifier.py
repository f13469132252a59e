"""rlvr's verifier vs math-verify on the same pairs: accuracy per category, throughput on numeric
and LaTeX answers, worst-case latency on hostile inputs, worker start cost per start method.

    .venv/bin/python benchmarks/verifier.py [--quick] [--mv-kill-s 10]

Writes benchmarks/results/verifier.json and benchmarks/results/verifier.md.

How math-verify is called (its documented usage, as in the CS336 / Dr. GRPO grader): both sides
wrapped in `$...$` when they contain no `$`, `verify(parse(gold), parse(pred))`, default
extraction configs and default timeouts. Every math-verify call runs in one of our killable worker
processes, so the benchmark itself cannot hang: a call still running after --mv-kill-s seconds is
killed and reported as "killed".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections import defaultdict
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlvr.rewards import grader as G  # noqa: E402
from rlvr.rewards.labeled.hostile import HOSTILE  # noqa: E402
from rlvr.rewards.pool import WorkerPool  # noqa: E402
from rlvr.rewards.types import Status  # noqa: E402

PAIRS_FILE = ROOT / "rlvr" / "rewards" / "labeled" / "equivalence_pairs.jsonl"
GSM8K_TEST = Path("/work/shared/data/gsm8k/test.jsonl")
RESULTS = ROOT / "benchmarks" / "results"


# --- math-verify side (runs inside worker processes) -----------------------------------------


def _wrap(s: str) -> str:
    return s if "$" in s else f"${s}$"


def mv_equal(pred: str, gold: str) -> bool:
    from math_verify import parse, verify

    return bool(verify(parse(_wrap(gold)), parse(_wrap(pred))))


def mv_default_in_thread_error() -> str:
    """What math-verify's default configuration does when called from a non-main thread."""
    out = [""]

    def run():
        try:
            mv_equal("1", "1")
            out[0] = "no error"
        except Exception as exc:  # noqa: BLE001
            out[0] = f"{type(exc).__name__}: {exc}"[:160]

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out[0]


def mv_equal_in_thread(pred: str, gold: str) -> tuple[bool, str]:
    """math-verify from a non-main thread. Its default (signal.alarm) timeouts raise ValueError
    there, so threaded users must turn them off (parsing_timeout=None, timeout_seconds=None),
    which is what we measure: nothing then bounds a call except our hard kill."""
    out: list = [False, ""]

    def run():
        from math_verify import parse, verify

        try:
            g = parse(_wrap(gold), parsing_timeout=None)
            p = parse(_wrap(pred), parsing_timeout=None)
            out[0] = bool(verify(g, p, timeout_seconds=None))
        except Exception as exc:  # noqa: BLE001
            out[1] = f"{type(exc).__name__}: {exc}"[:200]

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out[0], out[1]


def mv_throughput(pairs: list[tuple[str, str]]) -> tuple[float, int]:
    """(seconds, number correct) for grading all pairs once, in this (worker) process."""
    from math_verify import parse, verify

    parse("$1$")  # warm imports
    t0 = time.perf_counter()
    n_ok = 0
    for pred, gold in pairs:
        try:
            n_ok += bool(verify(parse(_wrap(gold)), parse(_wrap(pred))))
        except Exception:  # noqa: BLE001
            pass
    return time.perf_counter() - t0, n_ok


def mv_reward_throughput(rows: list[tuple[str, str]]) -> tuple[float, int]:
    """math-verify as a reward on whole responses: parse(response) with its default extraction,
    verify against parse(gold)."""
    from math_verify import parse, verify

    parse("$1$")
    t0 = time.perf_counter()
    n_ok = 0
    for response, gold in rows:
        try:
            n_ok += bool(verify(parse(_wrap(gold)), parse(response)))
        except Exception:  # noqa: BLE001
            pass
    return time.perf_counter() - t0, n_ok


def rlvr_reward_throughput(rows: list[tuple[str, str]]) -> tuple[float, int]:
    from rlvr.rewards.batch import score_batch

    G.set_cache(False)
    t0 = time.perf_counter()
    out = score_batch("gsm8k", [r for r, _ in rows], [g for _, g in rows])
    return time.perf_counter() - t0, sum(r.status is Status.CORRECT for r in out)


def rlvr_throughput(pairs: list[tuple[str, str]]) -> tuple[float, int]:
    G.set_cache(False)
    t0 = time.perf_counter()
    n_ok = sum(G.grade_answer(p, g).status is Status.CORRECT for p, g in pairs)
    return time.perf_counter() - t0, n_ok


# --- data -----------------------------------------------------------------------------------


def load_pairs() -> list[dict]:
    return [json.loads(line) for line in PAIRS_FILE.read_text().splitlines() if line.strip()]


def gsm8k_pairs(limit: int | None) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(plain, formatted): references vs themselves and vs +1; the formatted set writes the
    prediction the way models do ("$1,234.00", "1 234", "1234.0")."""
    refs = [json.loads(x)["answer"].split("####")[-1].strip() for x in GSM8K_TEST.read_text().splitlines() if x.strip()]
    if limit:
        refs = refs[:limit]
    plain, formatted = [], []
    for r in refs:
        v = Fraction(r.replace(",", ""))
        plain += [(r, r), (str(v + 1), r)]
        iv = int(v)
        formatted += [(f"\\${iv:,}.00", r), (f"{iv:,}".replace(",", " "), r), (f"{iv}.0", r), (f"{iv + 1:,}", r)]
    return plain, formatted


def latex_pairs(pairs: list[dict]) -> list[tuple[str, str]]:
    cats = {"fraction", "expression", "mixed_number", "scientific", "set", "tuple", "interval", "matrix", "equation"}
    return [(p["pred"], p["gold"]) for p in pairs if p["category"] in cats]


# --- measurements ---------------------------------------------------------------------------


def accuracy(pairs: list[dict], pool: WorkerPool, kill_s: float) -> dict:
    G.set_cache(False)
    per_cat: dict[str, dict[str, int]] = defaultdict(lambda: {"n": 0, "rlvr": 0, "math_verify": 0, "mv_killed": 0})
    disagreements = []
    for p in pairs:
        c = per_cat[p["category"]]
        c["n"] += 1
        v = G.grade_answer(p["pred"], p["gold"], tolerance=p.get("tolerance"))
        ours = v.status is Status.CORRECT
        c["rlvr"] += ours == p["equal"]
        res = pool.call("verifier:mv_equal", (p["pred"], p["gold"]), timeout_s=kill_s)
        theirs = bool(res.value) if res.status == "ok" else False
        if res.status == "timeout":
            c["mv_killed"] += 1
        c["math_verify"] += theirs == p["equal"]
        if theirs != p["equal"]:
            disagreements.append({**p, "math_verify": theirs, "mv_status": res.status})
    return {"per_category": dict(per_cat), "math_verify_wrong": disagreements}


def hostile(pool_mv: WorkerPool, kill_s: float, deadline: float, quick: bool) -> dict:
    G.set_cache(False)
    rows = []
    subset = HOSTILE if not quick else HOSTILE[:12]
    for text in subset:
        t0 = time.perf_counter()
        v = G.grade_answer(text, "1", timeout_s=deadline)
        ours_s = time.perf_counter() - t0
        row = {"input": text[:40] + ("..." if len(text) > 40 else ""), "chars": len(text), "rlvr_s": ours_s,
               "rlvr_status": v.status.value}  # fmt: skip
        for mode, target in (("mv_main", "verifier:mv_equal"), ("mv_thread", "verifier:mv_equal_in_thread")):
            t0 = time.perf_counter()
            res = pool_mv.call(target, (text, "1"), timeout_s=kill_s)
            row[f"{mode}_s"] = time.perf_counter() - t0
            if res.status == "timeout":
                row[f"{mode}_status"] = "killed"
            elif res.status == "error" or (isinstance(res.value, tuple) and res.value[1]):
                row[f"{mode}_status"] = "error"
            else:
                ok = res.value[0] if isinstance(res.value, tuple) else res.value
                row[f"{mode}_status"] = "correct" if ok else "incorrect"
        rows.append(row)
    default_thread = pool_mv.call("verifier:mv_default_in_thread_error", (), timeout_s=kill_s)
    return {"deadline_s": deadline, "kill_s": kill_s, "rows": rows, "mv_default_in_thread": str(default_thread.value)}


def worker_start_cost(repeats: int) -> dict:
    """Seconds to (re)start a worker and get a first answer, per start method."""
    out = {}
    for method in ("forkserver", "spawn"):
        times = []
        with WorkerPool(size=1, start_method=method) as pool:
            for _ in range(repeats):
                t0 = time.perf_counter()
                res = pool.call("rlvr.rewards.symbolic:equal", ("x+1", "1+x"), timeout_s=60)
                assert res.status == "ok", res
                times.append(time.perf_counter() - t0)
                # kill it so the next call pays a fresh start
                pool.call("time:sleep", (5,), timeout_s=0.01)
        out[method] = {"median_s": statistics.median(times), "max_s": max(times), "n": repeats}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer pairs and hostile inputs")
    ap.add_argument("--mv-kill-s", type=float, default=10.0, help="hard kill for one math-verify call")
    ap.add_argument("--deadline", type=float, default=1.0, help="rlvr symbolic deadline for hostile inputs")
    args = ap.parse_args()

    from importlib.metadata import version

    mv_version = version("math-verify")
    pairs = load_pairs()
    plain, formatted = gsm8k_pairs(200 if args.quick else None)
    lx = latex_pairs(pairs)

    G.set_cache(False)
    pool_mv = WorkerPool(size=1, mem_limit_mb=4096, preload=())
    G.grade_answer("x+1", "1+x")  # start our symbolic worker outside the timings
    results: dict = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load1": os.getloadavg()[0]},
        "math_verify_version": mv_version,
    }
    try:
        print("accuracy on labeled pairs ...", flush=True)
        results["accuracy"] = accuracy(pairs, pool_mv, args.mv_kill_s)

        print("throughput ...", flush=True)
        thr = {}
        for name, data in (("gsm8k_plain", plain), ("gsm8k_formatted", formatted), ("latex", lx)):
            reps = 5 if name != "latex" else 2
            ours = min(rlvr_throughput(data)[0] for _ in range(reps))
            res = pool_mv.call("verifier:mv_throughput", (data,), timeout_s=600)
            theirs = res.value[0] if res.status == "ok" else float("nan")
            thr[name] = {"pairs": len(data), "rlvr_per_s": len(data) / ours, "math_verify_per_s": len(data) / theirs,
                         "speedup": theirs / ours}  # fmt: skip
        # whole responses through the reward function: GSM8K solutions (answer on a "####" line)
        sols = [json.loads(x)["answer"] for x in GSM8K_TEST.read_text().splitlines() if x.strip()]
        if args.quick:
            sols = sols[:200]
        rows = [(sol, sol.split("####")[-1].strip()) for sol in sols]
        rows += [(sol.rsplit("####", 1)[0] + "#### " + str(Fraction(g.replace(",", "")) + 1), g) for sol, g in rows]
        ours_t, ours_ok = min(rlvr_reward_throughput(rows) for _ in range(3))
        res = pool_mv.call("verifier:mv_reward_throughput", (rows,), timeout_s=600)
        theirs_t, theirs_ok = res.value if res.status == "ok" else (float("nan"), 0)
        thr["gsm8k_responses"] = {"pairs": len(rows), "rlvr_per_s": len(rows) / ours_t,
                                  "math_verify_per_s": len(rows) / theirs_t, "speedup": theirs_t / ours_t,
                                  "rlvr_correct": ours_ok, "math_verify_correct": theirs_ok,
                                  "expected_correct": len(rows) // 2}  # fmt: skip
        results["throughput"] = thr

        print("hostile inputs ...", flush=True)
        results["hostile"] = hostile(pool_mv, args.mv_kill_s, args.deadline, args.quick)

        print("worker start cost ...", flush=True)
        results["worker_start"] = worker_start_cost(3 if args.quick else 5)
    finally:
        pool_mv.close()

    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "verifier.json").write_text(json.dumps(results, indent=2, ensure_ascii=False))
    md = render(results)
    (RESULTS / "verifier.md").write_text(md)
    print(md)


def render(r: dict) -> str:
    lines = [f"# Verifier benchmark: rlvr vs math-verify {r['math_verify_version']}", ""]
    m = r["machine"]
    lines += [f"Python {m['python']}, {m['cpus']} CPUs (shared; 1-min load {m['load1']:.1f} at start).", ""]
    lines += ["## Accuracy on the labeled pairs (share of pairs judged as labeled)", "",
              "| category | pairs | rlvr | math-verify | math-verify killed |", "|---|---:|---:|---:|---:|"]  # fmt: skip
    tot = {"n": 0, "rlvr": 0, "math_verify": 0}
    for cat, c in sorted(r["accuracy"]["per_category"].items()):
        lines.append(f"| {cat} | {c['n']} | {c['rlvr'] / c['n']:.3f} | {c['math_verify'] / c['n']:.3f} | {c['mv_killed']} |")
        for k in tot:
            tot[k] += c[k]
    lines.append(f"| **all** | {tot['n']} | {tot['rlvr'] / tot['n']:.3f} | {tot['math_verify'] / tot['n']:.3f} | |")
    lines += ["", "## Throughput (single thread, cache off, pairs per second)", "",
              "| answers | pairs | rlvr | math-verify | speedup |", "|---|---:|---:|---:|---:|"]  # fmt: skip
    for name, t in r["throughput"].items():
        lines.append(f"| {name} | {t['pairs']} | {t['rlvr_per_s']:,.0f} | {t['math_verify_per_s']:,.0f} | {t['speedup']:.1f}x |")
    lines += ["", "gsm8k_plain: reference vs itself and vs +1 (integers). gsm8k_formatted: the same values written "
              "`\\$1,234.00`, `1 234`, `1234.0`, `1,235`. latex: the fraction/expression/structure pairs of the "
              "labeled set (symbolic tier included, through the worker). gsm8k_responses: whole GSM8K solutions "
              "through the `gsm8k` reward (extraction included) vs math-verify parsing the whole response; "]  # fmt: skip
    t = r["throughput"].get("gsm8k_responses")
    if t:
        lines[-1] += (f"correct: rlvr {t['rlvr_correct']}, math-verify {t['math_verify_correct']}, "
                      f"expected {t['expected_correct']} of {t['pairs']}.")  # fmt: skip
    h = r["hostile"]
    lines += ["", f"## Hostile inputs (rlvr deadline {h['deadline_s']} s; math-verify hard-killed at {h['kill_s']} s)", "",
              "Graded against gold `1`. rlvr: `grade_answer` from the main thread. math-verify (main thread): "
              "default configuration, its own signal timeouts active. math-verify (thread): called from a "
              "non-main thread, where the default configuration raises "
              f"`{h.get('mv_default_in_thread', '?')[:90]}...`, so it runs with timeouts off as threaded users must.",
              "",
              "| input | chars | rlvr s | rlvr | math-verify (main thread) s | status | math-verify (thread) s | status |",
              "|---|---:|---:|---|---:|---|---:|---|"]  # fmt: skip
    for row in h["rows"]:
        inp = row["input"].replace("|", "\\|").replace("\n", " ").encode("unicode_escape").decode()
        lines.append(
            f"| `{inp}` | {row['chars']} | {row['rlvr_s']:.3f} | {row['rlvr_status']} | {row['mv_main_s']:.2f} | "
            f"{row['mv_main_status']} | {row['mv_thread_s']:.2f} | {row['mv_thread_status']} |"
        )
    worst = max(row["rlvr_s"] for row in h["rows"])
    lines += ["", f"rlvr worst case: {worst:.3f} s (deadline {h['deadline_s']} s). "
              f"math-verify worst case: {max(max(x['mv_main_s'], x['mv_thread_s']) for x in h['rows']):.2f} s "
              f"(killed at {h['kill_s']} s)."]  # fmt: skip
    lines += ["", "## Worker (re)start: first answer from a fresh worker", "", "| start method | median s | max s |",
              "|---|---:|---:|"]  # fmt: skip
    for meth, w in r["worker_start"].items():
        lines.append(f"| {meth} | {w['median_s']:.3f} | {w['max_s']:.3f} |")
    wrong = r["accuracy"]["math_verify_wrong"]
    if wrong:
        lines += ["", "## Pairs math-verify judges differently from the label", "", "| category | pred | gold | label | math-verify |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for w in wrong:
            lines.append(f"| {w['category']} | `{w['pred']}` | `{w['gold']}` | {w['equal']} | {w['math_verify']} ({w['mv_status']}) |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
