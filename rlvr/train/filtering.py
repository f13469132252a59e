"""`filter_problems(cfg: FilterConfig) -> FilterResult`: keep the training problems of a task whose pass rate
under a policy lies in a band, and write them as a dataset that `data.train_path=` reads back
(docs/filtering.md). `rlvr filter` and a pipeline's filter stage call it.

Steps, each optional except the third: (0) drop multiple-choice questions (filter.drop_multiple_choice,
Kimi k1.5); (1) drop problems whose word n-grams overlap an evaluation set (filter.decontaminate_against); (2) drop problems the policy solves without reasoning (filter.no_reasoning_k,
Qwen3); (3) sample filter.k answers per remaining problem, grade them with the task's checker and keep
filter.band. Multiple-choice, contaminated problems and those solved without reasoning are not sampled in step 3 (no compute
is spent on problems already dropped).

Output directory (run.out_dir): train.jsonl (the kept problems, the task's own row format: a file task's
rows as they were read, a synthetic task's problems as rows its loader parses), pass_rates.jsonl (every
problem: its counts and what happened to it), histogram.png, report.json and report.md.

The policy is loaded as `rlvr eval` loads it: model.name (tiny / folder / hub id) or model.init_from (a run
directory or checkpoint). Everything that can fail on the user's input (the task's files, the evaluation
files, the output directory) raises ConfigError or TaskDataError before the model is loaded.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rlvr.config import ConfigError, to_dict
from rlvr.data import DataError, get_task, iter_jsonl, write_jsonl
from rlvr.data.filters import (
    Band,
    PassCounts,
    band_split,
    decontaminate,
    estimate_pass_rates,
    multiple_choice,
    no_reasoning_prompt,
    rate_histogram,
)
from rlvr.data.templates import think_style
from rlvr.eval import CPU_EVAL_TOKENS, cpu_chunks
from rlvr.rollout import with_thinking_budget
from rlvr.rollout.types import SamplingSpec
from rlvr.runs.progress import Progress
from rlvr.train import session
from rlvr.train.config import FilterConfig
from rlvr.train.run_settings import find_run_dir
from rlvr.train.session import say
from rlvr.train.tasks import TaskDataError, check_data_files, load_task_data, task_scorer

OUTPUT_FILES = ("train.jsonl", "pass_rates.jsonl", "histogram.png", "report.json", "report.md")


@dataclass
class FilterResult:
    """What a filter wrote: the kept problems' dataset, and the report (report.json's content)."""

    out_dir: Path
    dataset: Path  # out_dir/train.jsonl: data.train_path of the training that follows
    report: dict[str, Any]

    @property
    def kept(self) -> int:
        return self.report["counts"]["kept"]

    @property
    def problems(self) -> int:
        return self.report["counts"]["problems"]


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
    out = []
    try:
        for where, row in iter_jsonl(path):
            text = next((row[k] for k in ("question", "problem", "prompt") if row.get(k) is not None), None)
            if text is None:
                raise ConfigError(f"--decontaminate-against {where}: no \"question\", \"problem\" or \"prompt\" key "
                                  f"(has: {', '.join(sorted(row)) or 'nothing'})")
            ident = next((row[k] for k in ("id", "unique_id", "task_id") if row.get(k) is not None), where)
            out.append({"id": str(ident), "question": str(text)})
    except DataError as exc:
        raise ConfigError(f"--decontaminate-against {exc}") from None
    if not out:
        raise ConfigError(f"--decontaminate-against {path}: the file has no problems")
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
            ["dropped: multiple choice", c.get("multiple_choice", 0)],
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



# ---------------------------------------------------------------------------------- the stage


def filter_problems(cfg: FilterConfig, *, resume: bool = False) -> FilterResult:
    """Run the filter of `cfg` (see the module docstring) and write its outputs under cfg.run.out_dir.
    resume is accepted for the stage contract and has no effect: a filter is re-run whole.

    Raises ConfigError / TaskDataError (bad input: the output directory, the task's files, an evaluation
    file; all before the model loads) and EngineError (the rollout engine failed)."""
    del resume
    t_start = time.perf_counter()
    sel = cfg.filter
    k, the_band = sel.k, Band.parse(sel.band)
    run_dir = find_run_dir(cfg.model.init_from) if cfg.model.init_from else None
    model_source = session.sampling_model_source(cfg.model)  # FileNotFoundError before any work
    out_dir, dataset_path = _check_output(cfg)
    sources = list(dict.fromkeys(sel.decontaminate_against))

    # ---- the task (cheap), evaluation files: everything that can fail does so before the model loads
    task, reg_task, train, rows, eval_items, eval_sources = _problems(cfg, sources)
    # ---- 0. multiple choice, 1. decontamination
    status, choice_of, decon = _prefilter(sel, train, eval_items)
    survivors = [i for i in range(len(train)) if status[i] == "kept"]

    # ---- the policy
    policy = (model_source or "a fresh tiny model (model.name=tiny, random weights)") + (
        f" (run {run_dir})" if run_dir is not None else "")
    spec = SamplingSpec.for_task(task, cfg.sampling, seed=cfg.run.seed, n=k, logprobs=False)
    reward_name = cfg.data.reward or reg_task.reward_name(task.template)
    decoding = (f"{'greedy' if spec.temperature == 0 else f'T={spec.temperature:g}'}"
                + (f" top_p={spec.top_p:g}" if spec.top_p < 1 else "") + f", max_tokens={spec.max_tokens}"
                + (f", stop={','.join(repr(x) for x in spec.stop)}" if spec.stop else ""))
    taken = f"; the run's data and response settings from {run_dir / 'config.yaml'}" if run_dir is not None else ""
    band_label = f"{the_band}" + (f" ({the_band.name})" if the_band.name else "")
    print(f"filtering {len(train)} training problems of {task.name} (template {task.template}, reward "
          f"{reward_name}) with {policy}: k={k} samples each, {decoding}, band {band_label}{taken}")
    if sel.drop_multiple_choice:
        print(f"multiple choice: dropped {len(choice_of)} of {len(train)}")
    if decon is not None:
        print(f"decontamination: dropped {len(decon.dropped)} of {len(train)} ({sel.ngram}-gram overlap >= "
              f"{sel.overlap:g} against {', '.join(dict.fromkeys(eval_sources))}, {len(eval_items)} problems)")
    t0 = time.perf_counter()
    task, sample = _sampling(cfg, task, reg_task, train, model_source)
    say(f"loaded in {time.perf_counter() - t0:.1f} s")

    # ---- 2. solved without reasoning
    t_sample = time.perf_counter()
    nr_indices = list(survivors)
    no_reasoning, nr_counts, survivors = _no_reasoning(cfg, task, spec, sample, status, survivors)
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
    out_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(dataset_path, [rows[i] for i in kept_indices])
    nr_of = {} if nr_counts is None else {
        i: (c, sel.no_reasoning_k) for i, c in zip(nr_indices, nr_counts.correct, strict=True)}
    write_jsonl(out_dir / "pass_rates.jsonl", _rate_rows(train, status, k, survivors, counts, nr_of, choice_of, decon))
    bins = rate_histogram(counts.correct, k, kept_mask)
    nr_bins = None
    if nr_counts is not None:
        nr_bins = rate_histogram(nr_counts.correct, sel.no_reasoning_k,
                                 [r <= sel.no_reasoning_max_rate + 1e-9 for r in nr_counts.rates])
    title = f"{task.name}: {len(counts)} problems sampled, kept {len(kept_indices)} of {len(train)}"
    draw_histogram(out_dir / "histogram.png", bins, str(the_band), title, nr_bins)

    settings = {"policy": policy, "model_source": model_source, "task": task.name, "template": task.template,
                "reward": reward_name, "k": k, "band": str(the_band), "band_name": the_band.name,
                "decoding": decoding, "seed": cfg.run.seed,
                "band_ends": {"low": the_band.low, "high": the_band.high, "low_inclusive": the_band.low_inclusive,
                              "high_inclusive": the_band.high_inclusive},
                "no_reasoning_k": sel.no_reasoning_k, "no_reasoning_max_rate": sel.no_reasoning_max_rate,
                "decontaminate_against": sources, "ngram": sel.ngram, "overlap": sel.overlap,
                "drop_multiple_choice": sel.drop_multiple_choice, "config": to_dict(cfg)}
    report = _report(settings, train, choice_of, decon, no_reasoning, counts, split, kept_indices, bins, nr_bins,
                     sel, eval_items, eval_sources, out_dir)
    report["time"] = {"sampling_s": sample_s, "total_s": time.perf_counter() - t_start}
    (out_dir / "report.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    (out_dir / "report.md").write_text(report_markdown(report), encoding="utf-8")
    return FilterResult(out_dir=out_dir, dataset=dataset_path, report=report)


def _prefilter(sel, train: list, eval_items: list[dict]):
    """(status per training problem, index -> why it is a multiple-choice question, the decontamination or
    None): steps 0 (multiple choice, data.filter.drop_multiple_choice) and 1 (n-gram overlap with the
    evaluation problems), before any sampling."""
    status = ["kept"] * len(train)
    choice_of: dict[int, str] = {}
    if sel.drop_multiple_choice:
        for i, ex in enumerate(train):
            if (why := multiple_choice(ex.question, ex.reference)) is not None:
                choice_of[i], status[i] = why, "multiple choice"
    decon = None
    if eval_items:
        decon = decontaminate([ex for i, ex in enumerate(train) if i not in choice_of], eval_items, n=sel.ngram,
                              threshold=sel.overlap)
        index_of = [i for i in range(len(train)) if i not in choice_of]  # back to positions in `train`
        decon = replace(decon, matches=[replace(m, index=index_of[m.index]) for m in decon.matches])
        for m in decon.matches:
            status[m.index] = "contaminated"
    return status, choice_of, decon


def _sampling(cfg: FilterConfig, task, reg_task, train: list, model_source: str | None):
    """(the task prompting with the loaded tokenizer, sample(indices, spec, description, prompt=None) ->
    PassCounts): the policy loaded, its chat template tried on one problem and every prompt's positions
    checked before any sampling, the engine started (session's stage kit)."""
    model, tok = session.sampling_policy(cfg.model, seed=cfg.run.seed, threads=cfg.run.num_threads,
                                        source=model_source)
    template, s, sel = task.template, cfg.sampling, cfg.filter
    task = replace(task, prompt=lambda ex: reg_task.prompt(ex, template, tok))
    try:
        task.prompt(train[0])  # a chat template without a tokenizer chat_template fails here, not mid-run
    except ValueError as exc:
        raise ConfigError(f"data.template={template}: {exc}") from None
    tokens, keys = s.max_tokens, f"sampling.max_tokens={s.max_tokens}"
    if s.thinking_budget > 0:
        tokens, keys = tokens + s.thinking_budget, f"{keys} + sampling.thinking_budget={s.thinking_budget}"
    session.check_prompts(model, tok, cfg.model, [(str(getattr(ex, "id", i)), task.prompt(ex))
                                                 for i, ex in enumerate(train)], tokens, keys)
    base_gen = session.sampler(cfg.rollout, model, tok, model_source=model_source, seed=cfg.run.seed,
                               batch_size=s.batch_size * max(sel.k, sel.no_reasoning_k))
    generator = with_thinking_budget(base_gen, s.thinking_budget, s.stop_thinking_text, template=template)
    scorer = task_scorer(task, cfg.data)

    def sample(indices: list[int], spec_, description: str, prompt=None) -> PassCounts:
        examples = [train[i] for i in indices]
        with Progress(total=len(examples), description=description, stream=sys.stderr) as bar:
            def progress(done: int, total: int) -> None:
                bar.update(done - bar.completed)

            # On CPU, problems per generate call sized by tokens (rlvr.eval.cpu_chunks): long prompts in a
            # fixed batch of sampling.batch_size x k rows are several times slower.
            budget = spec_.max_tokens + (max(s.thinking_budget, 0) if prompt is None else 0)
            texts = [(prompt or task.prompt)(ex) for ex in examples]  # a no-reasoning prompt is (prompt, prefix)
            chunks = cpu_chunks(tok, [p if isinstance(p, str) else p[0] for p in texts], n=spec_.n, max_tokens=budget,
                                max_prompts=s.batch_size, device=cfg.model.device, backend=cfg.rollout.backend)
            if chunks is not None and len(chunks) > 1:
                say(f"{description}: {len(examples)} problems x {spec_.n} samples in {len(chunks)} generate calls "
                    f"of at most {CPU_EVAL_TOKENS} tokens (CPU)")
            # The no-reasoning prompt closes the think block itself: no thinking budget around it.
            return estimate_pass_rates(generator if prompt is None else base_gen, task, examples, spec_,
                                       prompt=prompt, scorer=scorer, chunk_size=s.batch_size,
                                       chunks=chunks, on_progress=progress)

    return task, sample


def _no_reasoning(cfg: FilterConfig, task, spec, sample, status: list[str], survivors: list[int]):
    """Step 2, solved without reasoning (data.filter.no_reasoning_k samples with the think block closed):
    (its summary or None, its PassCounts or None, the survivors left); status updated in place."""
    sel = cfg.filter
    if not (sel.no_reasoning_k and survivors):
        return None, None, survivors
    nr_spec = replace(spec, n=sel.no_reasoning_k, seed=cfg.run.seed + 1)
    nr_counts = sample(survivors, nr_spec, "no-reasoning",
                       prompt=no_reasoning_prompt(task.prompt, style=think_style(task.template)))
    kept = []
    for i, rate in zip(survivors, nr_counts.rates, strict=True):
        if rate > sel.no_reasoning_max_rate + 1e-9:
            status[i] = "solved without reasoning"
        else:
            kept.append(i)
    summary = {"k": sel.no_reasoning_k, "max_rate": sel.no_reasoning_max_rate,
               "dropped": len(survivors) - len(kept), "sampled": len(survivors)}
    print(f"solved without reasoning: dropped {summary['dropped']} of {len(survivors)} "
          f"(k={sel.no_reasoning_k}, rate > {sel.no_reasoning_max_rate:g})")
    return summary, nr_counts, kept


def _rate_rows(train: list, status: list[str], k: int, survivors: list[int], counts: PassCounts,
               nr_of: dict[int, tuple[int, int]], choice_of: dict[int, str], decon) -> list[dict[str, Any]]:
    """pass_rates.jsonl: one row per training problem, its status and what each step found."""
    per_problem = {i: {"correct": counts.correct[j], "k": k, "pass_rate": counts.rates[j], "failed": counts.failed[j]}
                   for j, i in enumerate(survivors)}
    contaminated_by = {m.index: m for m in (decon.matches if decon else [])}
    rows = []
    for i, ex in enumerate(train):
        row: dict[str, Any] = {"index": i, "id": str(ex.id), "status": status[i],
                               **per_problem.get(i, {"correct": None, "k": k, "pass_rate": None, "failed": None})}
        if i in nr_of:
            row["no_reasoning_correct"], row["no_reasoning_k"] = nr_of[i]
        if i in choice_of:
            row["multiple_choice"] = choice_of[i]
        if i in contaminated_by:
            row["eval_id"] = contaminated_by[i].eval_id
            row["overlap"] = contaminated_by[i].overlap
        rows.append(row)
    return rows


def _report(settings: dict, train: list, choice_of: dict, decon, no_reasoning, counts: PassCounts, split: dict,
            kept_indices: list[int], bins, nr_bins, sel, eval_items: list, eval_sources: list[str],
            out_dir: Path) -> dict[str, Any]:
    """report.json (without its time, which the caller adds last)."""
    k, rates = sel.k, counts.rates
    matches = [{**m.row(), "eval_source": eval_sources[m.eval_index]} for m in (decon.matches if decon else [])]
    return {
        "settings": settings,
        "counts": {
            "problems": len(train),
            "multiple_choice": len(choice_of),
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
            "n": sel.ngram, "threshold": sel.overlap, "against": list(dict.fromkeys(eval_sources)),
            "eval_problems": len(eval_items), "dropped": len(decon.dropped), "matches": matches,
        } if decon is not None else None,
        "files": {key: str(out_dir / name) for key, name in zip(
            ("dataset", "pass_rates", "histogram", "report_json", "report_md"), OUTPUT_FILES, strict=True)},
    }


def _check_output(cfg: FilterConfig) -> tuple[Path, Path]:
    """(run.out_dir, its train.jsonl), refused when it would overwrite the input or an earlier filter's files."""
    out_dir = Path(cfg.run.out_dir)
    dataset_path = out_dir / "train.jsonl"
    if cfg.data.train_path and Path(cfg.data.train_path).resolve() == dataset_path.resolve():
        raise ConfigError(f"run.out_dir={cfg.run.out_dir}: its train.jsonl is data.train_path itself; choose another "
                          "run.out_dir")
    existing = [name for name in OUTPUT_FILES if (out_dir / name).exists()]
    if existing and not cfg.run.overwrite:
        raise ConfigError(f"run.out_dir={cfg.run.out_dir} already holds {', '.join(existing)}: "
                          "set run.overwrite=true to replace them, or choose another run.out_dir")
    return out_dir, dataset_path


def _problems(cfg: FilterConfig, sources: list[str]):
    """(task, registered task, training problems, their dataset rows, evaluation problems, each one's source)
    with every problem of the task's files and the evaluation files reported before the model loads."""
    use_task_eval = "eval" in sources
    data_cfg = cfg.data if use_task_eval else replace(cfg.data, num_eval=0, eval_path="")
    try:
        check_data_files(data_cfg, train=True)  # every bad line at once
        task = load_task_data(data_cfg, None, train=True)
    except TaskDataError:
        raise
    except (ValueError, KeyError, OSError) as exc:
        raise ConfigError(str(exc)) from None
    reg_task = get_task(cfg.data.task)
    train = list(task.train)
    if not train:
        where = f"data.train_path={cfg.data.train_path}" if cfg.data.train_path else f"data.num_train={cfg.data.num_train}"
        raise ConfigError(f"{where}: task {cfg.data.task!r} has no training problems to filter")
    try:
        rows = training_rows(cfg.data, reg_task, train)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    eval_items: list[dict] = []
    eval_sources: list[str] = []
    for src in sources:
        if src == "eval":
            if not task.eval:
                raise ConfigError(f"--decontaminate-against eval: task {cfg.data.task!r} has no held-out problems; "
                                  "set data.eval_path=FILE or name the evaluation file")
            items = [{"id": str(ex.id), "question": ex.question} for ex in task.eval]
            label = cfg.data.eval_path or f"{cfg.data.task} held-out split"
        else:
            items, label = read_eval_file(src), src
        eval_items += items
        eval_sources += [label] * len(items)
    return task, reg_task, train, rows, eval_items, eval_sources
