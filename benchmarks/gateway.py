"""Episodes through the rollout gateway (rlvr.gateway: an OpenAI-compatible HTTP server, agents on the official
openai client) against the same episodes through rlvr.envs (the in-process episode driver): same tiny model,
same prompts, same turns and token counts.

    RLVR_NUM_THREADS=1 .venv/bin/python benchmarks/gateway.py [--episodes 32] [--tokens 16] [--rounds 5]

Each episode is two model turns of exactly `tokens` tokens (min_tokens = max_tokens), with a tool message
between them. rlvr.envs samples each turn of every episode in one generate call; through the gateway, one thread
per episode runs an openai-client agent (two chat calls, the tool message appended in between) and the gateway
batches the calls that arrive together into generate calls. The agents run in one other process (threads, as
agent programs run outside the trainer; their clients made before the clock starts): the comparison measures the
gateway (HTTP, JSON, the chat template, the batching) and the client's calls, not an agent program's start-up.

Reported per path: episodes/s (median over interleaved rounds, after one warm-up round each) and, for the gateway,
the overhead per call: (gateway wall - envs wall) / calls per episode, against the generation time of one call
(envs wall / calls per episode), and the gateway's own gateway/overhead_s_mean (server time per call minus its
share of the generate call). Writes benchmarks/results/gateway.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import statistics
import threading
import time
from pathlib import Path

import torch

from rlvr.data.example import Example
from rlvr.envs.base import Environment, StepResult
from rlvr.envs.format import TurnFormat
from rlvr.envs.rollout import run_episodes
from rlvr.gateway.server import Gateway
from rlvr.models import build_tiny_model
from rlvr.rewards.types import Reward, Status
from rlvr.rollout import HFGenerator, SamplingSpec
from rlvr.runtime import set_num_threads

RESULTS = Path(__file__).parent / "results"
TOOL_TEXT = "result: 42"


class TwoTurns(Environment):
    """Two model turns, the tool message TOOL_TEXT between them."""

    name = "two_turns"

    def reset(self, example) -> str:
        self._begin()
        return example.question

    def step(self, action: str) -> StepResult:
        return StepResult(TOOL_TEXT, done=self.log.turns >= 2)

    def final_reward(self) -> Reward:
        return Reward(0.0, {}, Status.INCORRECT)


def envs_round(gen, tok, examples, spec) -> tuple[float, int]:
    t0 = time.perf_counter()
    eps = run_episodes(gen, lambda: TwoTurns(max_turns=2), examples, spec, tok, fmt=TurnFormat(tok, "chat"),
                       max_tokens_total=4 * spec.max_tokens + 64)
    wall = time.perf_counter() - t0
    assert all(sum(e.rollout.loss_mask) == 2 * spec.max_tokens for e in eps)
    return wall, sum(e.log.turns for e in eps)


def _agents(conn) -> None:
    """The agent process: per round, one thread per episode running an openai-client agent (two chat calls, the
    tool message appended in between); clients are made before the parent's "go" (an agent program's start-up is
    not the gateway's)."""
    import openai

    while (job := conn.recv()) is not None:
        base_url, keys, questions, tokens = job
        clients = [openai.OpenAI(base_url=base_url, api_key=k, max_retries=0, timeout=120) for k in keys]
        go = threading.Barrier(len(keys) + 1)
        errors: list[str] = []

        def agent(question, client, go=go, errors=errors, tokens=tokens):
            go.wait()
            try:
                messages = [{"role": "user", "content": question}]
                for turn in range(2):
                    reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=tokens)
                    messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                                 {"role": "tool", "tool_call_id": f"c{turn}", "content": TOOL_TEXT}]
            except Exception as exc:  # noqa: BLE001 - reported to the parent
                errors.append(repr(exc))

        threads = [threading.Thread(target=agent, args=(q, c)) for q, c in zip(questions, clients, strict=True)]
        for t in threads:
            t.start()
        conn.send("ready")
        conn.recv()
        go.wait()
        for t in threads:
            t.join()
        conn.send(errors)


def gateway_round(gw, conn, examples, tokens: int) -> tuple[float, dict]:
    keys = [gw.open_episode(f"b{i}", seed=i) for i in range(len(examples))]
    gw.metrics()
    conn.send((gw.base_url, keys, [ex.question for ex in examples], tokens))
    assert conn.recv() == "ready"
    t0 = time.perf_counter()
    conn.send("go")
    errors = conn.recv()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"agent errors: {errors[:3]}")
    records = [gw.close_episode(k) for k in keys]
    assert all(len(r.calls) == 2 and sum(len(c.completion_ids) for c in r.calls) == 2 * tokens for r in records)
    return wall, gw.metrics()


def measure(gen, tok, gw, conn, n: int, tokens: int, rounds: int) -> dict:
    """One work size: rounds interleaved (envs first in even rounds), after a warm-up round of each."""
    examples = [Example(id=f"q{i}", question=f"{i}+{i % 7}=", reference=str(i + i % 7)) for i in range(n)]
    spec = SamplingSpec(n=1, temperature=1.0, max_tokens=tokens, min_tokens=tokens, seed=0)
    gw.spec = spec
    envs, gate, gw_metrics = [], [], []
    for r in range(rounds + 1):  # round 0 warms both paths up
        for path in (("envs", "gateway") if r % 2 == 0 else ("gateway", "envs")):
            if path == "envs":
                wall, _ = envs_round(gen, tok, examples, spec)
                envs += [wall] if r else []
            else:
                wall, m = gateway_round(gw, conn, examples, tokens)
                gate += [wall] if r else []
                gw_metrics += [m] if r else []
    e_wall, g_wall = statistics.median(envs), statistics.median(gate)
    calls = 2 * n  # two model calls per episode
    return {"episodes": n, "tokens_per_turn": tokens, "envs_wall_s": e_wall, "gateway_wall_s": g_wall,
            "envs_episodes_per_s": n / e_wall, "gateway_episodes_per_s": n / g_wall,
            # one call is generated in a batch of the turn's calls: its generation time is the turn's
            "generation_s_per_call": e_wall / 2, "overhead_s_per_call": (g_wall - e_wall) / calls,
            "overhead_share_of_call": (g_wall - e_wall) / calls / (e_wall / 2),
            "throughput_ratio": e_wall / g_wall,
            "batch_size_median": statistics.median(m["gateway/batch_size_mean"] for m in gw_metrics),
            "server_s_per_call": statistics.median(m["gateway/overhead_s_mean"] for m in gw_metrics),
            "envs_rounds_s": envs, "gateway_rounds_s": gate}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--tokens", default="16,64", help="tokens per model turn, one row each (comma-separated)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--results-dir", default=str(RESULTS))
    args = ap.parse_args()
    set_num_threads(args.threads)
    model, tok = build_tiny_model(seed=0)
    gen = HFGenerator(model, tok, batch_size=args.episodes)
    parent, child = multiprocessing.get_context("spawn").Pipe()
    agents = multiprocessing.get_context("spawn").Process(target=_agents, args=(child,), daemon=True)
    agents.start()
    try:
        with Gateway(gen, tok, SamplingSpec(), max_batch=args.episodes) as gw:
            rows = [measure(gen, tok, gw, parent, args.episodes, int(t), args.rounds) for t in args.tokens.split(",")]
    finally:
        parent.send(None)
        agents.join(10)
    result = {
        "command": "python benchmarks/gateway.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in
                                                               vars(args).items() if k != "results_dir"),
        "rounds": args.rounds, "threads": args.threads, "rows": rows,
        "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
    }
    md = [f"Command: `{result['command']}`; {args.episodes} concurrent episodes of 2 model turns, a tool message "
          f"between them; the tiny model (rlvr.models.build_tiny_model defaults), {args.threads} thread(s); median "
          f"of {args.rounds} interleaved rounds; torch {torch.__version__}.", "",
          "| tokens per turn | rlvr.envs episodes/s | gateway episodes/s | generation per call ms | gateway overhead "
          "per call ms | overhead / generation | calls per generate | server ms per call |",
          "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    md += [f"| {r['tokens_per_turn']} | {r['envs_episodes_per_s']:.1f} | {r['gateway_episodes_per_s']:.1f} | "
           f"{r['generation_s_per_call'] * 1e3:.1f} | {r['overhead_s_per_call'] * 1e3:.2f} | "
           f"**{100 * r['overhead_share_of_call']:.1f}%** | {r['batch_size_median']:.1f} | "
           f"{r['server_s_per_call'] * 1e3:.1f} |" for r in rows]
    md += ["", "Generation per call: a call is generated in one batch with the turn's other calls, so its generation "
           "time is the turn's (rlvr.envs wall / 2). Gateway overhead per call: (gateway wall - rlvr.envs wall) / "
           "calls. Server ms per call: the gateway's gateway/overhead_s_mean (its time per call outside generate, "
           "waiting in the batch included)."]
    text = "\n".join(md) + "\n"
    print(text)
    out = Path(args.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gateway.md").write_text(text)
    (out / "gateway.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
