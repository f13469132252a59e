"""`rlvr filter [CONFIG.yaml] [key=value ...] [--k K] [--band BAND] ...`: keep the training problems of
a task whose pass rate under a policy lies in a band, and write them as a dataset that
`data.train_path=` reads back (docs/filtering.md).

Steps, each optional except the third: (1) drop problems whose word n-grams overlap an evaluation
set (--decontaminate-against); (2) drop problems the policy solves without reasoning
(--no-reasoning-k, Qwen3); (3) sample k answers per remaining problem (--k), grade them with the
task's checker and keep the band (--band). Contaminated problems and those solved without
reasoning are not sampled in step 3 (no compute is spent on problems already dropped).

Output directory (run.out_dir): train.jsonl (the kept problems, the task's own row format: a file
task's rows as they were read, a synthetic task's problems as rows its loader parses),
pass_rates.jsonl (every problem: its counts and what happened to it), histogram.png, report.json and
report.md.

The policy is loaded as `rlvr eval` loads it: model.name (tiny / folder / hub id) or model.init_from
(a run directory or checkpoint; a run's task and response settings are then the lowest layer).
Everything that can fail on the command line (options, keys, the task's files, the evaluation files)
fails before the model is loaded, with exit status 2.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import typer

from rlvr.commands._config_cli import fail, load_or_exit, with_keys_help
from rlvr.train.config import DataConfig, ModelConfig, RolloutConfig, _check_sampling, _Checks


@dataclass
class FilterSamplingConfig:
    """How the k answers per problem are sampled (k itself is --k)."""

    temperature: float = 1.0
    """Sampling temperature; pass rates are meant at the temperature you will train with."""
    top_p: float = 1.0
    """Nucleus sampling threshold; 1.0 = off."""
    max_tokens: int = 16
    """Maximum response length in tokens."""
    stop: list[str] = field(default_factory=list)
    """Stop strings added to the task's own and end-of-sequence."""
    keep_stop: bool = True
    """Keep the stop string at the end of the response text."""
    thinking_budget: int = -1
    """Qwen3-style thinking budget in tokens for the pass-rate samples (-1 = off)."""
    stop_thinking_text: str = ""
    """Text forced when the thinking budget runs out; '' = Qwen3's."""
    batch_size: int = 64
    """Problems per generate call (each with k samples; on CPU with the hf engine also at most 16384 tokens a
    call, rlvr.eval.CPU_EVAL_TOKENS); the progress bar advances per call."""

    def validate(self) -> None:
        c = _Checks("sampling")
        c.at_least("batch_size", self.batch_size, 1)
        _check_sampling(c, self)
        c.done()


@dataclass
class FilterRunConfig:
    """Seed, threads and output of `rlvr filter`."""

    seed: int = 0
    """Sampling seed."""
    num_threads: int = 0
    """torch CPU threads; 0 = RLVR_NUM_THREADS or torch's default."""
    out_dir: str = "filtered"
    """Output directory: train.jsonl, pass_rates.jsonl, histogram.png, report.json, report.md."""
    overwrite: bool = False
    """Replace the files of an earlier filter in run.out_dir."""

    def validate(self) -> None:
        c = _Checks("run")
        c.at_least("num_threads", self.num_threads, 0)
        c.need("out_dir", self.out_dir, bool(self.out_dir.strip()), "a directory path")
        c.done()


@dataclass
class FilterConfig:
    """Keep a task's training problems by pass rate: `rlvr filter`."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Policy whose pass rates are measured (model.name or model.init_from)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Task and training problems (data.train_path or the task's generator, data.num_train of them)."""
    sampling: FilterSamplingConfig = field(default_factory=FilterSamplingConfig)
    """Decoding of the k samples per problem."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Engine (hf or vllm)."""
    run: FilterRunConfig = field(default_factory=FilterRunConfig)
    """Seed, threads, output directory."""

    def validate(self) -> None:
        self.data.check_problem_counts(("train",))


OUTPUT_FILES = ("train.jsonl", "pass_rates.jsonl", "histogram.png", "report.json", "report.md")


def _say(message: str) -> None:
    typer.echo(message, err=True)


# ------------------------------------------------------------------------------ dataset rows


def example_rows(ex) -> list[dict[str, Any]]:
    """Candidate JSONL rows of a generated Example, plainest first: id, question, reference,
    solution, meta; then the same with the meta keys again at the top level (countdown reads
    numbers/target there, code its tests and entry point). row_that_loads_back picks the first the
    task's loader parses back to the same problem."""
    row: dict[str, Any] = {"id": ex.id, "question": ex.question, "reference": ex.reference}
    if ex.solution is not None:
        row["solution"] = ex.solution
    if not ex.meta:
        return [row]
    row["meta"] = dict(ex.meta)
    return [row, {**{k: v for k, v in ex.meta.items() if k not in row}, **row}]


def _loads_back(reg_task, row: dict, ex) -> bool | None:
    """True: the row parses to ex (id, question, reference, meta kept); False: only the id differs; None: worse."""
    try:
        back = reg_task.parse_row(row, "check", -1)
    except Exception:  # noqa: BLE001 - any failure means this candidate row is not usable
        return None
    if (back.question, back.reference) != (ex.question, ex.reference):
        return None
    # What the loader keeps of meta must be what the problem had ("source", the file:line a loader
    # records, moves; keys a loader does not keep, such as a generator's "split", are not the checker's).
    if any(ex.meta[key] != value for key, value in back.meta.items() if key in ex.meta and key != "source"):
        return None
    return back.id == ex.id


def row_that_loads_back(reg_task, rows: list[dict], ex) -> dict:
    """The first of `rows` (candidates for one problem) the task's loader parses back to `ex`, with an
    "id" added when the task would otherwise number it by its line (GSM8K rows without an id are
    "gsm8k:<line>", and lines move when problems are dropped)."""
    candidates = []
    for row in rows:
        candidates.append(row)
        if "id" not in row:
            candidates += [{**row, "id": ex.id}, {**row, "id": ex.id.removeprefix(f"{reg_task.name}:")}]
    first_ok = None
    for cand in candidates:
        ok = _loads_back(reg_task, cand, ex)
        if ok:
            return cand
        if ok is False and first_ok is None:
            first_ok = cand
    if first_ok is not None:
        return first_ok
    raise ValueError(f"task {reg_task.name!r}: problem {ex.id!r} cannot be written as a row its loader reads back")


def training_rows(data_cfg, reg_task, examples) -> list[dict]:
    """One row per training example, in the task's file format: a file task's rows as read from
    data.train_path (the same first data.num_train), a synthetic task's problems via example_row."""
    if data_cfg.train_path:
        from rlvr.data import iter_jsonl

        raw = [[row] for _, row in iter_jsonl(data_cfg.train_path, reg_task.required_keys)]
        if data_cfg.num_train:
            raw = raw[: data_cfg.num_train]
        if len(raw) != len(examples):
            raise ValueError(f"data.train_path={data_cfg.train_path}: {len(raw)} rows but {len(examples)} problems")
    else:
        if reg_task.parse_row is None:
            raise ValueError(f"task {reg_task.name!r} has no row format to write its problems in")
        raw = [example_rows(ex) for ex in examples]
    return [row_that_loads_back(reg_task, row, ex) for row, ex in zip(raw, examples, strict=True)]


def read_eval_file(path: str) -> list[dict]:
    """Evaluation problems of any task's JSONL: the text is "question", "problem" or "prompt"; the id
    "id", "unique_id" or "task_id" (else file:line)."""
    from rlvr.data import DataError, iter_jsonl

    out = []
    try:
        for where, row in iter_jsonl(path):
            text = next((row[k] for k in ("question", "problem", "prompt") if row.get(k) is not None), None)
            if text is None:
                fail(f"--decontaminate-against {where}: no \"question\", \"problem\" or \"prompt\" key "
                     f"(has: {', '.join(sorted(row)) or 'nothing'})")
            ident = next((row[k] for k in ("id", "unique_id", "task_id") if row.get(k) is not None), where)
            out.append({"id": str(ident), "question": str(text)})
    except DataError as exc:
        fail(f"--decontaminate-against {exc}")
    if not out:
        fail(f"--decontaminate-against {path}: the file has no problems")
    return out


# ---------------------------------------------------------------------------------- outputs


def draw_histogram(path: Path, bins: list[dict], band_text: str, title: str,
                   no_reasoning_bins: list[dict] | None = None) -> Path:
    """Bar chart of problems per pass rate j/k, kept (colour) and dropped (grey) stacked; a second
    panel for the no-reasoning pass rates when there are any."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    def ticks(ax, bins_: list[dict]) -> None:
        k_ = len(bins_) - 1
        every = max(1, -(-len(bins_) // 16))  # at most ~16 labels when k is large
        shown = [i for i in range(len(bins_)) if i % every == 0 or i == k_]
        ax.set_xticks(shown, [f"{bins_[i]['correct']}/{k_}" for i in shown])
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))

    panels = 2 if no_reasoning_bins else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.2 * panels, 3.8), squeeze=False)
    ax = axes[0][0]
    xs = list(range(len(bins)))
    kept = [b["kept"] for b in bins]
    dropped = [b["count"] - b["kept"] for b in bins]
    ax.bar(xs, kept, color="tab:green", label=f"kept (band {band_text})")
    ax.bar(xs, dropped, bottom=kept, color="tab:gray", alpha=0.6, label="dropped")
    k = len(bins) - 1
    ticks(ax, bins)
    ax.set_xlabel(f"pass rate (correct of k={k} samples)")
    ax.set_ylabel("problems")
    ax.set_title("pass rate with reasoning", fontsize=11)
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    if no_reasoning_bins:
        ax2 = axes[0][1]
        k2 = len(no_reasoning_bins) - 1
        xs2 = list(range(len(no_reasoning_bins)))
        kept2 = [b["kept"] for b in no_reasoning_bins]
        drop2 = [b["count"] - b["kept"] for b in no_reasoning_bins]
        ax2.bar(xs2, kept2, color="tab:blue", label="passed on")
        ax2.bar(xs2, drop2, bottom=kept2, color="tab:gray", alpha=0.6, label="solved without reasoning")
        ticks(ax2, no_reasoning_bins)
        ax2.set_xlabel(f"pass rate without reasoning (correct of k={k2})")
        ax2.set_title("no-reasoning prompt", fontsize=11)
        ax2.legend(fontsize=8)
        ax2.grid(True, axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _md_table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def report_markdown(report: dict[str, Any]) -> str:
    """report.md: settings, what was dropped at each step, counts per band and per pass-rate bin,
    and the contaminated problems with their matches."""
    s = report["settings"]
    c = report["counts"]
    pr = report["pass_rates"]
    parts = [
        "# Difficulty filter report",
        "",
        f"- policy: {s['policy']}",
        f"- task: {s['task']} (template {s['template']}, reward {s['reward']}), {c['problems']} training problems",
        f"- pass rates: k={s['k']} samples per problem, {s['decoding']}, seed {s['seed']}",
        f"- band: {s['band']}" + (f" ({s['band_name']})" if s.get("band_name") else "")
        + " (`[`/`]` include the end, `(`/`)` exclude it)",
        f"- kept: **{c['kept']} of {c['problems']}** -> `{report['files']['dataset']}`",
        "",
        "## What was dropped, step by step",
        "",
        _md_table(["step", "problems"], [
            ["training problems", c["problems"]],
            ["dropped: overlaps the evaluation set", c["contaminated"]],
            ["dropped: solved without reasoning", c["solved_without_reasoning"]],
            ["sampled for pass rates", c["sampled"]],
            ["dropped: pass rate below the band", c["below_band"]],
            ["dropped: pass rate above the band", c["above_band"]],
            ["kept", c["kept"]],
        ]),
        "",
        "## Pass rates of the sampled problems",
        "",
        _md_table(["band", "problems"], [
            ["never solved (r = 0)", pr["never_solved"]],
            ["medium (0 < r < 1)", pr["medium"]],
            ["always solved (r = 1)", pr["always_solved"]],
        ]) + (f"\n\nMean pass rate {pr['mean']:.3f}." if pr["mean"] is not None else ""),
        "",
        _md_table(["correct of k", "pass rate", "problems", "kept"],
                  [[f"{b['correct']}/{s['k']}", f"{b['rate']:.3f}", b["count"], b["kept"]] for b in report["bins"]]),
        "",
    ]
    if pr["failed_samples"]:
        parts += [f"{pr['failed_samples']} samples could not be graded (checker timeout or error); they count "
                  "as not solved.", ""]
    nr = report.get("no_reasoning")
    if nr:
        parts += ["## Solved without reasoning", "",
                  f"k={nr['k']} samples per problem with a closed, empty think block; problems solved in more than "
                  f"{nr['max_rate']:g} of them were dropped: {nr['dropped']}.", ""]
    dc = report.get("decontamination")
    if dc:
        parts += ["## Decontamination", "",
                  f"{dc['n']}-gram overlap >= {dc['threshold']:g} (share of the training problem's word {dc['n']}-grams "
                  f"found in one evaluation problem) against {', '.join(dc['against'])} "
                  f"({dc['eval_problems']} evaluation problems): dropped {dc['dropped']}.", ""]
        if dc["matches"]:
            parts += [_md_table(["training id", "evaluation id", "source", "overlap", "shared n-grams",
                                 "a shared n-gram", "training problem", "evaluation problem"],
                                [[m["id"], m["eval_id"], m["eval_source"], f"{m['overlap']:.2f}", m["shared"],
                                  m["ngram"], m["text"], m["eval_text"]] for m in dc["matches"]]), ""]
    parts += ["## Files", "", *(f"- {k}: `{v}`" for k, v in report["files"].items()), ""]
    return "\n".join(parts)


# ---------------------------------------------------------------------------------- command


def _run_base(init_from: str) -> tuple[Path | None, dict | None]:
    """A run directory behind model.init_from and the settings `rlvr eval` takes from it (its data
    section with the run's own data.num_train, its response settings)."""
    from rlvr.commands.eval import find_run_dir, run_settings

    run_dir = find_run_dir(init_from)
    if run_dir is None:
        return None, None
    import yaml

    base = run_settings(run_dir)
    raw = (yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {}).get("data") or {}
    base["data"].pop("num_train", None)
    if "num_train" in raw:
        base["data"]["num_train"] = raw["num_train"]
    return run_dir, base


@with_keys_help(FilterConfig)
def filter(  # noqa: A001 - the command is called `filter`
    args: list[str] = typer.Argument(None, help="Optional RUN_DIR (a run, checkpoint or model folder) or CONFIG.yaml, then dotted key=value overrides."),
    k: int = typer.Option(8, "--k", help="Samples per problem for its pass rate."),
    band: str = typer.Option(
        "medium", "--band",
        help="Pass rates kept: a name (medium = (0, 1), never-solved = [0, 0], not-always-solved = [0, 1), "
             "solved-at-least-once = (0, 1], all = [0, 1]) or an interval such as '[0.25, 0.75]' "
             "('['/']' include the end, '('/')' exclude it)."),
    no_reasoning_k: int = typer.Option(
        0, "--no-reasoning-k",
        help="First sample this many answers per problem with a closed, empty think block and drop the problems "
             "solved without reasoning (Qwen3); 0 = off."),
    no_reasoning_max_rate: float = typer.Option(
        0.0, "--no-reasoning-max-rate",
        help="With --no-reasoning-k: drop a problem whose no-reasoning pass rate is above this (0 = solved once)."),
    decontaminate_against: list[str] = typer.Option(
        None, "--decontaminate-against",
        help="Drop training problems that overlap these evaluation problems: a JSONL file (question / problem / "
             "prompt key) or 'eval' (the task's held-out split); repeatable."),
    ngram: int = typer.Option(8, "--ngram", help="Decontamination: word n-gram size."),
    overlap: float = typer.Option(
        0.5, "--overlap",
        help="Decontamination: drop when this share of a training problem's n-grams is in one evaluation problem "
             "(0 = any shared n-gram)."),
    threads: int = typer.Option(0, "--threads", help="torch CPU threads (sets run.num_threads)."),
) -> None:
    """Keep the training problems whose pass rate under a policy lies in a band; write them as a dataset.

    Writes RUN.OUT_DIR/train.jsonl (read it back with data.train_path=...), pass_rates.jsonl,
    histogram.png, report.json and report.md.

    Examples: `rlvr filter model.init_from=runs/sft --k 8` (medium band), `rlvr filter model.init_from=runs/sft
    --band never-solved` (Kimi's best-of-k), `rlvr filter model.name=Qwen/Qwen3-1.7B data.task=math
    data.train_path=train.jsonl --decontaminate-against math500.jsonl --no-reasoning-k 4`.
    """
    from rlvr.data.filters import Band

    t_start = time.perf_counter()
    extra = [f"run.num_threads={threads}"] if threads else []
    from rlvr.commands.eval import policy_positionals

    args = policy_positionals(args)  # `rlvr filter runs/sft`, as `rlvr eval runs/sft`
    cfg = load_or_exit(FilterConfig, args, extra=extra)
    run_dir = None
    taken = ""
    if cfg.model.init_from:
        from rlvr.train.common import resolve_model_dir

        try:
            resolve_model_dir(cfg.model.init_from)
        except FileNotFoundError as exc:
            fail(str(exc))
        run_dir, base = _run_base(cfg.model.init_from)
        if run_dir is not None:
            cfg = load_or_exit(FilterConfig, args, base=base, extra=extra)
            if cfg.data.task != base["data"].get("task", DataConfig.task):
                base["data"] = {}  # another task than the run's: its data section does not apply
                cfg = load_or_exit(FilterConfig, args, base=base, extra=extra)
            taken = f"; the run's data and response settings from {run_dir / 'config.yaml'}"

    # ---- options
    if k < 1:
        fail(f"--k {k}: samples per problem must be >= 1")
    try:
        the_band = Band.parse(band)
    except ValueError as exc:
        fail(f"--band {exc}")
    if no_reasoning_k < 0:
        fail(f"--no-reasoning-k {no_reasoning_k}: must be >= 0 (0 = off)")
    if not 0.0 <= no_reasoning_max_rate <= 1.0:
        fail(f"--no-reasoning-max-rate {no_reasoning_max_rate}: must be in [0, 1]")
    if ngram < 1:
        fail(f"--ngram {ngram}: must be >= 1")
    if not 0.0 <= overlap <= 1.0:
        fail(f"--overlap {overlap}: must be in [0, 1]")
    sources = list(dict.fromkeys(decontaminate_against or []))
    out_dir = Path(cfg.run.out_dir)
    dataset_path = out_dir / "train.jsonl"
    if cfg.data.train_path and Path(cfg.data.train_path).resolve() == dataset_path.resolve():
        fail(f"run.out_dir={cfg.run.out_dir}: its train.jsonl is data.train_path itself; choose another run.out_dir")
    existing = [name for name in OUTPUT_FILES if (out_dir / name).exists()]
    if existing and not cfg.run.overwrite:
        fail(f"run.out_dir={cfg.run.out_dir} already holds {', '.join(existing)}: "
             "set run.overwrite=true to replace them, or choose another run.out_dir")

    # ---- the task (cheap), evaluation files: everything that can fail does so before the model loads
    from rlvr.data import get_task
    from rlvr.train.tasks import TaskDataError, check_data_files, load_task_data, task_scorer

    use_task_eval = "eval" in sources
    data_cfg = cfg.data if use_task_eval else replace(cfg.data, num_eval=0, eval_path="")
    try:
        check_data_files(data_cfg, train=True)  # every bad line at once
        task = load_task_data(data_cfg, None, train=True)
    except (TaskDataError, ValueError, KeyError, OSError) as exc:
        fail(str(exc))
    reg_task = get_task(cfg.data.task)
    train = list(task.train)
    if not train:
        where = f"data.train_path={cfg.data.train_path}" if cfg.data.train_path else f"data.num_train={cfg.data.num_train}"
        fail(f"{where}: task {cfg.data.task!r} has no training problems to filter")
    try:
        rows = training_rows(cfg.data, reg_task, train)
    except ValueError as exc:
        fail(str(exc))
    eval_items: list[dict] = []
    eval_sources: list[str] = []
    for src in sources:
        if src == "eval":
            if not task.eval:
                fail(f"--decontaminate-against eval: task {cfg.data.task!r} has no held-out problems; "
                     "set data.eval_path=FILE or name the evaluation file")
            items = [{"id": str(ex.id), "question": ex.question} for ex in task.eval]
            label = cfg.data.eval_path or f"{cfg.data.task} held-out split"
        else:
            items, label = read_eval_file(src), src
        eval_items += items
        eval_sources += [label] * len(items)

    # ---- 1. decontamination
    from rlvr.data.filters import (
        PassCounts,
        band_split,
        decontaminate,
        estimate_pass_rates,
        no_reasoning_prompt,
        rate_histogram,
    )
    from rlvr.data.templates import think_style

    status = ["kept"] * len(train)
    decon = None
    if eval_items:
        decon = decontaminate(train, eval_items, n=ngram, threshold=overlap)
        for m in decon.matches:
            status[m.index] = "contaminated"
    survivors = [i for i in range(len(train)) if status[i] == "kept"]

    # ---- the policy
    from rlvr.runtime import set_num_threads

    set_num_threads(cfg.run.num_threads or None)
    from rlvr.train.common import policy_from_config, quiet_transformers

    quiet_transformers()
    model_source = None
    if cfg.model.init_from:
        from rlvr.train.common import resolve_model_dir

        model_source = str(resolve_model_dir(cfg.model.init_from))
    elif cfg.model.name != "tiny":
        model_source = cfg.model.name
    policy = model_source or "a fresh tiny model (model.name=tiny, random weights)"
    if run_dir is not None:
        policy += f" (run {run_dir})"
    from rlvr.rollout.types import SamplingSpec

    spec = SamplingSpec.for_task(task, cfg.sampling, seed=cfg.run.seed, n=k, logprobs=False)
    reward_name = cfg.data.reward or reg_task.reward_name(task.template)
    decoding = (f"{'greedy' if spec.temperature == 0 else f'T={spec.temperature:g}'}"
                + (f" top_p={spec.top_p:g}" if spec.top_p < 1 else "") + f", max_tokens={spec.max_tokens}"
                + (f", stop={','.join(repr(x) for x in spec.stop)}" if spec.stop else ""))
    band_label = f"{the_band}" + (f" ({the_band.name})" if the_band.name else "")
    typer.echo(f"filtering {len(train)} training problems of {task.name} (template {task.template}, reward "
               f"{reward_name}) with {policy}: k={k} samples each, {decoding}, band {band_label}{taken}")
    if decon is not None:
        typer.echo(f"decontamination: dropped {len(decon.dropped)} of {len(train)} ({ngram}-gram overlap >= "
                   f"{overlap:g} against {', '.join(dict.fromkeys(eval_sources))}, {len(eval_items)} problems)")
    _say(f"loading model {model_source or 'tiny (fresh random weights)'} ...")
    t0 = time.perf_counter()
    try:
        model, tok = policy_from_config(cfg.model, seed=cfg.run.seed)
    except (ValueError, KeyError, OSError) as exc:
        fail(str(exc))
    model.eval()
    template = task.template
    task = replace(task, prompt=lambda ex: reg_task.prompt(ex, template, tok))
    try:
        task.prompt(train[0])  # a chat template without a tokenizer chat_template fails here, not mid-run
    except ValueError as exc:
        fail(f"data.template={template}: {exc}")
    from rlvr.config import ConfigError
    from rlvr.models.positions import check_positions

    tokens, keys = spec.max_tokens, f"sampling.max_tokens={spec.max_tokens}"
    if cfg.sampling.thinking_budget > 0:
        tokens, keys = tokens + cfg.sampling.thinking_budget, f"{keys} + sampling.thinking_budget={cfg.sampling.thinking_budget}"
    try:  # before any sampling: prompt + response within the model's positions
        check_positions(model, tok, [(str(getattr(ex, "id", i)), task.prompt(ex)) for i, ex in enumerate(train)],
                        tokens, response_keys=keys, model_desc=f"model.init_from={cfg.model.init_from}"
                        if cfg.model.init_from else f"model.name={cfg.model.name}")
    except ConfigError as exc:
        fail(str(exc))

    from rlvr.rollout import build_generator, with_thinking_budget
    from rlvr.rollout.types import EngineError

    try:
        base_gen = build_generator(cfg.rollout, model, tok, model_source=model_source, seed=cfg.run.seed,
                                   default_batch_size=cfg.sampling.batch_size * max(k, no_reasoning_k))
    except (KeyError, ImportError, ValueError, EngineError) as exc:
        fail(str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc))
    generator = with_thinking_budget(base_gen, cfg.sampling.thinking_budget, cfg.sampling.stop_thinking_text,
                                     template=template)
    _say(f"loaded in {time.perf_counter() - t0:.1f} s")
    scorer = task_scorer(task, cfg.data)

    from rlvr.runs.progress import Progress

    def sample(indices: list[int], spec_, description: str, prompt=None) -> PassCounts:
        examples = [train[i] for i in indices]
        with Progress(total=len(examples), description=description, stream=sys.stderr) as bar:
            def progress(done: int, total: int) -> None:
                bar.update(done - bar.completed)

            # On CPU, problems per generate call sized by tokens (rlvr.eval.cpu_chunks): long prompts in a
            # fixed batch of sampling.batch_size x k rows were several times slower.
            from rlvr.eval import cpu_chunks

            budget = spec_.max_tokens + (max(cfg.sampling.thinking_budget, 0) if prompt is None else 0)
            texts = [(prompt or task.prompt)(ex) for ex in examples]  # a no-reasoning prompt is (prompt, prefix)
            chunks = cpu_chunks(tok, [p if isinstance(p, str) else p[0] for p in texts], n=spec_.n, max_tokens=budget,
                                max_prompts=cfg.sampling.batch_size, device=cfg.model.device,
                                backend=cfg.rollout.backend)
            if chunks is not None and len(chunks) > 1:
                from rlvr.eval import CPU_EVAL_TOKENS

                _say(f"{description}: {len(examples)} problems x {spec_.n} samples in {len(chunks)} generate calls "
                     f"of at most {CPU_EVAL_TOKENS} tokens (CPU)")
            # The no-reasoning prompt closes the think block itself: no thinking budget around it.
            try:
                return estimate_pass_rates(generator if prompt is None else base_gen, task, examples, spec_,
                                           prompt=prompt, scorer=scorer, chunk_size=cfg.sampling.batch_size,
                                           chunks=chunks, on_progress=progress)
            except EngineError as exc:  # the engine failed mid-run: one line, not vLLM's traceback
                fail(str(exc))

    # ---- 2. solved without reasoning
    no_reasoning = None
    nr_counts = None
    nr_indices = list(survivors)
    t_sample = time.perf_counter()
    if no_reasoning_k and survivors:
        nr_spec = replace(spec, n=no_reasoning_k, seed=cfg.run.seed + 1)
        nr_counts = sample(survivors, nr_spec, "no-reasoning", prompt=no_reasoning_prompt(task.prompt, style=think_style(template)))
        nr_kept = []
        for i, rate in zip(survivors, nr_counts.rates, strict=True):
            if rate > no_reasoning_max_rate + 1e-9:
                status[i] = "solved without reasoning"
            else:
                nr_kept.append(i)
        no_reasoning = {"k": no_reasoning_k, "max_rate": no_reasoning_max_rate,
                        "dropped": len(survivors) - len(nr_kept), "sampled": len(survivors)}
        typer.echo(f"solved without reasoning: dropped {no_reasoning['dropped']} of {len(survivors)} "
                   f"(k={no_reasoning_k}, rate > {no_reasoning_max_rate:g})")
        survivors = nr_kept

    # ---- 3. pass rates and the band
    counts = sample(survivors, spec, "pass rates") if survivors else PassCounts([], [], k, [])
    sample_s = time.perf_counter() - t_sample
    split = band_split(counts.rates, the_band)
    for side, label in (("below", "below band"), ("above", "above band")):
        for j in split[side]:
            status[survivors[j]] = label
    kept_mask = [False] * len(counts)
    for j in split["kept"]:
        kept_mask[j] = True
    kept_indices = [i for i in range(len(train)) if status[i] == "kept"]

    # ---- outputs
    from rlvr.data import write_jsonl

    out_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(dataset_path, [rows[i] for i in kept_indices])
    per_problem: dict[int, dict] = {}
    for j, i in enumerate(survivors):
        per_problem[i] = {"correct": counts.correct[j], "k": k, "pass_rate": counts.rates[j],
                          "failed": counts.failed[j]}
    nr_of: dict[int, tuple[int, int]] = {}
    if nr_counts is not None:
        nr_of = {i: (c, no_reasoning_k) for i, c in zip(nr_indices, nr_counts.correct, strict=True)}
    contaminated_by = {m.index: m for m in (decon.matches if decon else [])}
    rate_rows = []
    for i, ex in enumerate(train):
        row: dict[str, Any] = {"index": i, "id": str(ex.id), "status": status[i],
                               **per_problem.get(i, {"correct": None, "k": k, "pass_rate": None, "failed": None})}
        if i in nr_of:
            row["no_reasoning_correct"], row["no_reasoning_k"] = nr_of[i]
        if i in contaminated_by:
            row["eval_id"] = contaminated_by[i].eval_id
            row["overlap"] = contaminated_by[i].overlap
        rate_rows.append(row)
    write_jsonl(out_dir / "pass_rates.jsonl", rate_rows)

    bins = rate_histogram(counts.correct, k, kept_mask)
    nr_bins = None
    if nr_counts is not None:
        nr_bins = rate_histogram(nr_counts.correct, no_reasoning_k,
                                 [r <= no_reasoning_max_rate + 1e-9 for r in nr_counts.rates])
    rates = counts.rates
    title = f"{task.name}: {len(counts)} problems sampled, kept {len(kept_indices)} of {len(train)}"
    draw_histogram(out_dir / "histogram.png", bins, str(the_band), title, nr_bins)

    matches = []
    for m in (decon.matches if decon else []):
        matches.append({**m.row(), "eval_source": eval_sources[m.eval_index]})
    report: dict[str, Any] = {
        "settings": {
            "policy": policy, "model_source": model_source, "task": task.name, "template": task.template,
            "reward": reward_name, "k": k, "band": str(the_band), "band_name": the_band.name,
            "decoding": decoding, "seed": cfg.run.seed,
            "band_ends": {"low": the_band.low, "high": the_band.high, "low_inclusive": the_band.low_inclusive,
                          "high_inclusive": the_band.high_inclusive},
            "no_reasoning_k": no_reasoning_k, "no_reasoning_max_rate": no_reasoning_max_rate,
            "decontaminate_against": sources, "ngram": ngram, "overlap": overlap,
            "config": _config_dict(cfg),
        },
        "counts": {
            "problems": len(train),
            "contaminated": len(decon.dropped) if decon else 0,
            "solved_without_reasoning": no_reasoning["dropped"] if no_reasoning else 0,
            "sampled": len(counts),
            "below_band": len(split["below"]),
            "above_band": len(split["above"]),
            "kept": len(kept_indices),
        },
        "pass_rates": {
            "never_solved": sum(c == 0 for c in counts.correct),
            "medium": sum(0 < c < k for c in counts.correct),
            "always_solved": sum(c == k for c in counts.correct),
            "mean": sum(rates) / len(rates) if rates else None,
            "failed_samples": sum(counts.failed),
        },
        "bins": bins,
        "no_reasoning": {**no_reasoning, "bins": nr_bins} if no_reasoning else None,
        "decontamination": {
            "n": ngram, "threshold": overlap, "against": list(dict.fromkeys(eval_sources)),
            "eval_problems": len(eval_items), "dropped": len(decon.dropped), "matches": matches,
        } if decon is not None else None,
        "files": {key: str(out_dir / name) for key, name in zip(
            ("dataset", "pass_rates", "histogram", "report_json", "report_md"), OUTPUT_FILES, strict=True)},
        "time": {"sampling_s": sample_s, "total_s": time.perf_counter() - t_start},
    }
    (out_dir / "report.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    (out_dir / "report.md").write_text(report_markdown(report), encoding="utf-8")

    pr = report["pass_rates"]
    mean = f", mean {pr['mean']:.3f}" if pr["mean"] is not None else ""
    typer.echo(f"pass rates of {len(counts)} problems: never solved {pr['never_solved']}, medium {pr['medium']}, "
               f"always solved {pr['always_solved']}{mean} ({sample_s:.1f} s of sampling)")
    typer.echo(f"kept {len(kept_indices)} of {len(train)} (band {the_band}: {len(split['below'])} below, "
               f"{len(split['above'])} above) -> {dataset_path}")
    if not kept_indices:
        _say(f"warning: no problem was kept: no pass rate of k={k} samples lies in the band {the_band}; see the "
             f"histogram, then choose another --band (or a larger --k, another policy or sampling.temperature)")
    typer.echo(f"report: {out_dir / 'report.md'} (also report.json, pass_rates.jsonl, histogram.png)")
    typer.echo(f"train on it: data.task={task.name} data.train_path={dataset_path}"
               + (f" data.template={task.template}" if cfg.data.template else ""))


def _config_dict(cfg) -> dict:
    from rlvr.config import to_dict

    return to_dict(cfg)
