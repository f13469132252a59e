"""`rlvr filter [RUN_DIR | CONFIG.yaml] [key=value ...] [--k K] [--band BAND] ...`: parse the config, call
rlvr.train.filtering.filter_problems, print what it kept (docs/filtering.md).

Each flag sets the filter.* key of its name (--k 8 is filter.k=8) above the file and the overrides. A run
directory as model.init_from supplies its task and response settings as the lowest layer, as for `rlvr eval`.
Everything that can fail on the command line (keys, the task's files, the evaluation files) fails before the
model is loaded, with exit status 2.
"""

from __future__ import annotations

import typer

from rlvr.commands.config_cli import (
    check_user_reward,
    load_from_run,
    policy_positionals,
    run_stage,
    threads_override,
    with_keys_help,
)
from rlvr.config import field_docs
from rlvr.train.config import FILTER_FLAGS, FilterConfig, FilterSelectConfig

_DOCS = field_docs(FilterConfig)


def _flag_overrides(values: dict) -> list[tuple]:
    """A typed override filter.KEY=VALUE for each flag given (the value as typer parsed it: a path of
    --decontaminate-against is never read as YAML)."""
    return [(f"filter.{key}", value, f"{FILTER_FLAGS[key]} {value}") for key, value in values.items()
            if value not in (None, [])]


def _flag(key: str) -> typer.models.OptionInfo:
    """The flag of filter.KEY: unset (None) unless given, its help the key's own doc."""
    default = getattr(FilterSelectConfig(), key)
    return typer.Option(None, FILTER_FLAGS[key], help=f"{_DOCS[f'filter.{key}']} Sets filter.{key} "
                        f"(default {default!r}){'; repeatable' if isinstance(default, list) else ''}.")


@with_keys_help(FilterConfig)
def filter(  # noqa: A001 - the command is called `filter`
    args: list[str] = typer.Argument(None, help="Optional RUN_DIR (a run, checkpoint or model folder) or CONFIG.yaml, then dotted key=value overrides."),
    k: int = _flag("k"),
    band: str = _flag("band"),
    no_reasoning_k: int = _flag("no_reasoning_k"),
    no_reasoning_max_rate: float = _flag("no_reasoning_max_rate"),
    decontaminate_against: list[str] = _flag("decontaminate_against"),
    ngram: int = _flag("ngram"),
    overlap: float = _flag("overlap"),
    drop_multiple_choice: bool = typer.Option(False, FILTER_FLAGS["drop_multiple_choice"],
                                              help=f"{_DOCS['filter.drop_multiple_choice']} Sets "
                                              "filter.drop_multiple_choice=true."),
    threads: int = typer.Option(0, "--threads", help="torch CPU threads (sets run.num_threads)."),
) -> None:
    """Keep the training problems whose pass rate under a policy lies in a band; write them as a dataset.

    Writes RUN.OUT_DIR/train.jsonl (read it back with data.train_path=...), pass_rates.jsonl,
    histogram.png, report.json and report.md.

    Examples: `rlvr filter model.init_from=runs/sft --k 8` (medium band), `rlvr filter data.task=math
    --drop-multiple-choice` (Kimi's rule: no guessable options), `rlvr filter model.init_from=runs/sft
    --band never-solved` (Kimi's best-of-k), `rlvr filter model.name=Qwen/Qwen3-1.7B data.task=math
    data.train_path=train.jsonl --decontaminate-against math500.jsonl --no-reasoning-k 4`.
    """
    from rlvr.train.filtering import filter_problems

    extra = threads_override(threads)
    extra += _flag_overrides({
        "k": k, "band": band, "no_reasoning_k": no_reasoning_k, "no_reasoning_max_rate": no_reasoning_max_rate,
        "decontaminate_against": list(decontaminate_against or []), "ngram": ngram, "overlap": overlap,
        "drop_multiple_choice": drop_multiple_choice or None})
    args = policy_positionals(args)  # `rlvr filter runs/sft`, as `rlvr eval runs/sft`
    cfg, _run_dir = load_from_run(FilterConfig, args, extra, training=True)
    check_user_reward(cfg.data.reward)  # a reward function of the user's: one call before the model loads
    result = run_stage(filter_problems, cfg)

    report = result.report
    c, pr, the_band, k = report["counts"], report["pass_rates"], report["settings"]["band"], report["settings"]["k"]
    mean = f", mean {pr['mean']:.3f}" if pr["mean"] is not None else ""
    typer.echo(f"pass rates of {c['sampled']} problems: never solved {pr['never_solved']}, medium {pr['medium']}, "
               f"always solved {pr['always_solved']}{mean} ({report['time']['sampling_s']:.1f} s of sampling)")
    typer.echo(f"kept {c['kept']} of {c['problems']} (band {the_band}: {c['below_band']} below, "
               f"{c['above_band']} above) -> {result.dataset}")
    if not c["kept"]:
        typer.echo(f"warning: no problem was kept: no pass rate of k={k} samples lies in the band {the_band}; see "
                   f"the histogram, then choose another --band (or a larger --k, another policy or "
                   "sampling.temperature)", err=True)
    typer.echo(f"report: {result.out_dir / 'report.md'} (also report.json, pass_rates.jsonl, histogram.png)")
    typer.echo(f"train on it: data.task={report['settings']['task']} data.train_path={result.dataset}"
               + (f" data.template={report['settings']['template']}" if cfg.data.template else ""))
