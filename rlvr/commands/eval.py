"""`rlvr eval [CONFIG.yaml] [key=value ...]`: accuracy / pass@k / format rate / lengths of a policy."""

from __future__ import annotations

import typer

from rlvr.commands._config_cli import fail, load_or_exit, with_keys_help
from rlvr.train.config import EvalConfig


@with_keys_help(EvalConfig)
def eval(  # noqa: A001 - the command is called `eval`
    args: list[str] = typer.Argument(None, help="Optional CONFIG.yaml, then dotted key=value overrides."),
    threads: int = typer.Option(0, "--threads", help="torch CPU threads (sets run.num_threads)."),
) -> None:
    """Evaluate a policy on held-out problems of a task.

    Example: `rlvr eval model.init_from=runs/demo/grpo data.task=arithmetic sampling.n=8 sampling.temperature=1`.
    """
    import json
    from pathlib import Path

    from rlvr.eval import evaluate
    from rlvr.rollout import HFGenerator, SamplingSpec
    from rlvr.runtime import set_num_threads
    from rlvr.train.common import policy_from_config, quiet_transformers
    from rlvr.train.tasks import load_task_data, task_scorer

    cfg = load_or_exit(EvalConfig, args, extra=[f"run.num_threads={threads}"] if threads else [])
    set_num_threads(cfg.run.num_threads or None)
    quiet_transformers()
    s = cfg.sampling
    try:
        spec = SamplingSpec(n=s.n, temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens,
                            stop=tuple(s.stop), seed=cfg.run.seed, logprobs=False)
        model, tok = policy_from_config(cfg.model, seed=cfg.run.seed)
        task = load_task_data(cfg.data, tok)
    except (ValueError, KeyError, OSError) as exc:
        fail(str(exc))
    examples = list(task.eval[: cfg.data.num_eval] if cfg.data.num_eval else task.eval)
    if not examples:
        fail(f"task {cfg.data.task!r} has no held-out problems; set data.eval_path")
    model.eval()
    result = evaluate(HFGenerator(model, tok, batch_size=s.batch_size), examples,
                      [task.prompt(ex) for ex in examples], None, spec, chunk_size=s.batch_size,
                      scorer=task_scorer(task, cfg.data))
    metrics = result.metrics()
    from rlvr.eval import comparison_text

    label = "greedy" if s.temperature == 0 else f"T={s.temperature}, n={s.n}"
    typer.echo(comparison_text({label: metrics}, title=f"{task.name}: {len(examples)} held-out problems"))
    if cfg.run.out:
        out = Path(cfg.run.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(metrics, indent=1))
        with open(out.with_suffix(".samples.jsonl"), "w", encoding="utf-8") as f:
            for row in result.sample_rows():
                f.write(json.dumps(row) + "\n")
        typer.echo(f"wrote {out} and {out.with_suffix('.samples.jsonl')}")
