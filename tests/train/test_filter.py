"""Difficulty filtering (issue 10 item 3 and its filtering acceptance test): pass rates from k
samples of a scripted policy that always solves some problems, never others and some exactly half
the time; bands that keep exactly what they say (the medium band, never-solved only, one end
dropped); a no-reasoning prompt; curriculum weights; n-gram decontamination that drops exactly the
planted near-duplicates and names their matches; and `rlvr filter` end to end (scripted and real
tiny policy) writing a dataset that loads back through data.train_path, a histogram and a report."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.data import get_task
from rlvr.data.filters import (
    BANDS,
    Band,
    PassRateTable,
    band_mask,
    band_split,
    count_correct,
    curriculum_sample,
    curriculum_weights,
    decontaminate,
    estimate_pass_rates,
    filter_by_band,
    ngrams,
    no_reasoning_prompt,
    rate_histogram,
)
from rlvr.rewards.types import Reward, Status
from rlvr.rollout import SamplingSpec
from rlvr.train.config import DataConfig
from rlvr.train.tasks import load_task_data

KINDS = ("always", "half", "never")


class ScriptedPolicy:
    """A Generator whose answers follow a script per question: "always" right, "never" right, "half"
    right on even sample indices (exactly k/2 of k, whatever the chunking), "trivial" right even
    without reasoning. Prompts that hold a closed think block (the no-reasoning prompt) are answered
    right only for "trivial" questions. Every call is recorded."""

    def __init__(self, script: dict[str, tuple[str, str]]):
        self.script = script  # question -> (kind, reference)
        self.calls: list[tuple[list[str], object]] = []

    def update_weights(self, named_tensors, version: int) -> None:
        pass

    def generate(self, prompts, spec):
        self.calls.append((list(prompts), spec))
        out = []
        for i, prompt in enumerate(prompts):
            question, think, _ = prompt.partition("<think>")
            kind, reference = self.script[question.strip()]
            for j in range(spec.n):
                right = kind in ("always", "trivial") or (kind == "half" and j % 2 == 0)
                if think and kind != "trivial":
                    right = False
                out.append(SimpleNamespace(group=i, sample_index=j, text=reference if right else "-1",
                                           response_ids=[0], finish_reason="stop"))
        return out


def _examples(n: int, kinds=KINDS, seed: int = 0):
    """n arithmetic problems; problem i is of kind kinds[i % len(kinds)]."""
    examples = get_task("arithmetic").generate(n, "train", seed, digits=2)
    script = {ex.question: (kinds[i % len(kinds)], ex.reference) for i, ex in enumerate(examples)}
    return examples, script


def _task():
    return load_task_data(DataConfig(task="arithmetic", num_train=0, num_eval=0), train=False)


# ------------------------------------------------------------------------------------ pass rates


def test_pass_counts_are_exact_and_do_not_depend_on_chunking():
    examples, script = _examples(9)
    task = _task()
    spec = SamplingSpec(n=4, temperature=1.0, max_tokens=4, seed=7, logprobs=False)
    policy = ScriptedPolicy(script)
    whole = estimate_pass_rates(policy, task, examples, spec)
    assert whole.k == 4 and len(whole) == 9
    assert whole.correct == [4, 2, 0] * 3  # always, half, never
    assert whole.rates == [1.0, 0.5, 0.0] * 3
    assert whole.ids == [ex.id for ex in examples] and whole.failed == [0] * 9
    assert len(policy.calls) == 1

    progress = []
    chunked_policy = ScriptedPolicy(script)
    chunked = estimate_pass_rates(chunked_policy, task, examples, spec, chunk_size=4,
                                  on_progress=lambda done, total: progress.append((done, total)))
    assert chunked.correct == whole.correct
    assert progress == [(4, 9), (8, 9), (9, 9)]
    # each chunk samples with its own seed (the first keeps spec.seed), so chunks do not repeat streams
    seeds = [s.seed for _, s in chunked_policy.calls]
    assert seeds[0] == 7 and len(set(seeds)) == 3
    assert [len(p) for p, _ in chunked_policy.calls] == [4, 4, 1]
    rows = chunked.rows()
    assert rows[1] == {"id": examples[1].id, "correct": 2, "k": 4, "pass_rate": 0.5, "failed": 0}


def test_timeouts_and_checker_errors_count_as_not_solved_and_are_reported():
    examples, script = _examples(3, kinds=("always",))
    statuses = iter([Status.CORRECT, Status.TIMEOUT, Status.ERROR, Status.CORRECT] * 3)

    def scorer(responses, exs):
        return [Reward(0.0, {}, next(statuses)) for _ in responses]

    counts = count_correct(ScriptedPolicy(script), examples, [e.question for e in examples],
                           SamplingSpec(n=4, seed=0), scorer=scorer)
    assert counts.correct == [2, 2, 2] and counts.failed == [2, 2, 2]


def test_a_generator_that_returns_the_wrong_count_is_an_error():
    examples, script = _examples(2)

    class Short(ScriptedPolicy):
        def generate(self, prompts, spec):
            return super().generate(prompts, spec)[:-1]

    with pytest.raises(ValueError, match="returned 7 rollouts for 2 x n=4"):
        count_correct(Short(script), examples, [e.question for e in examples], SamplingSpec(n=4),
                      reward_fn=_task().reward_fn)


# ------------------------------------------------------------------------------------------ bands


def test_bands_keep_exactly_the_configured_pass_rates():
    examples, script = _examples(9)
    counts = estimate_pass_rates(ScriptedPolicy(script), _task(), examples, SamplingSpec(n=4, seed=0))
    by_kind = {kind: [ex for i, ex in enumerate(examples) if KINDS[i % 3] == kind] for kind in KINDS}

    def kept(band):
        return filter_by_band(examples, counts.rates, band)

    def of(*kinds):
        return [ex for ex in examples if script[ex.question][0] in kinds]

    assert kept("medium") == by_kind["half"] == kept(Band()) == kept("(0, 1)")  # the default drops both ends
    assert kept("never-solved") == by_kind["never"] == kept("[0,0]")  # Kimi: never solved in k tries
    assert kept("not-always-solved") == of("half", "never") == kept("[0, 1)")
    assert kept("solved-at-least-once") == of("always", "half") == kept("(0, 1]")
    assert kept("all") == examples
    assert kept("[0.5, 1]") == of("half", "always")
    assert kept("(0.5, 1]") == by_kind["always"]  # the open end excludes 0.5 itself
    assert kept(Band.between(0.0, 0.5)) == of("never", "half")
    split = band_split(counts.rates, "medium")
    assert split == {"kept": [1, 4, 7], "below": [2, 5, 8], "above": [0, 3, 6], "unknown": []}


def test_band_ends_hold_for_thirds_and_bad_bands_say_what_is_accepted():
    rates = [0 / 3, 1 / 3, 2 / 3, 3 / 3]
    assert band_split(rates, "[0.333333, 0.666667]")["kept"] == [1, 2]  # written to 6 places, still in
    assert band_split(rates, "(0.333333, 0.666667)")["kept"] == []
    assert str(Band.parse("[0,0]")) == "[0, 0]" and Band.parse("[0,0]").name == "never-solved"
    assert str(BANDS["medium"]) == "(0, 1)"
    for bad, message in [("(0, 0)", "empty"), ("[0.5, 0.2]", "0 <= low <= high <= 1"), ("[0, 2]", "<= 1"),
                         ("hard", "expected a name"), ("[a, b]", "expected a name")]:
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
            Band.parse(bad)
    with pytest.raises(ValueError, match="3 examples but 2 pass rates"):
        filter_by_band([1, 2, 3], [0.5, 0.5])


def test_online_helpers_keep_unmeasured_problems_and_survive_a_checkpoint():
    table = PassRateTable()
    examples, script = _examples(6)
    counts = estimate_pass_rates(ScriptedPolicy(script), _task(), examples[:3], SamplingSpec(n=4, seed=0))
    table.update(counts, step=10)
    ids = [ex.id for ex in examples]
    assert table.rates(ids) == [1.0, 0.5, 0.0, None, None, None]
    assert table.step_of(ids[0]) == 10 and table.step_of(ids[4]) is None
    assert band_mask(table.rates(ids), "medium") == [False, True, False, True, True, True]
    assert band_mask(table.rates(ids), "medium", unknown=False) == [False, True, False, False, False, False]
    restored = PassRateTable()
    restored.load_state_dict(json.loads(json.dumps(table.state_dict())))
    assert restored.rates(ids) == table.rates(ids) and len(restored) == 3
    # a refresh replaces the old counts (the policy moved)
    table.update(type(counts)(ids=[ids[0]], correct=[1], k=4), step=20)
    assert table.rate(ids[0]) == 0.25 and table.step_of(ids[0]) == 20
    assert rate_histogram(counts.correct, 4, [False, True, False]) == [
        {"correct": 0, "rate": 0.0, "count": 1, "kept": 0}, {"correct": 1, "rate": 0.25, "count": 0, "kept": 0},
        {"correct": 2, "rate": 0.5, "count": 1, "kept": 1}, {"correct": 3, "rate": 0.75, "count": 0, "kept": 0},
        {"correct": 4, "rate": 1.0, "count": 1, "kept": 0}]


# ----------------------------------------------------------------------------------- no reasoning


def test_no_reasoning_prompts_close_the_think_block_and_grade_it_with_the_response():
    from rlvr.data.templates import empty_think_block
    from rlvr.rewards import get_reward_fn

    r1 = get_task("arithmetic")
    ex = r1.generate(1, "train", 0, digits=2)[0]
    r1_prompt = no_reasoning_prompt(lambda e: r1.prompt(e, "r1_zero"))
    text, block = r1_prompt(ex)
    assert block == " </think> <answer>" and text.endswith("Assistant: <think> </think> <answer>")
    # the r1_zero checker sees the forced block + the sampled answer: format and answer both right
    assert get_reward_fn("r1_zero")(block + f"{ex.reference}</answer>", ex).status is Status.CORRECT
    # Qwen3 style: the non-thinking block its chat template writes, as a thinking budget of 0 does
    chat = "<|im_start|>user\n2+2=<|im_end|>\n<|im_start|>assistant\n"
    text, block = no_reasoning_prompt(lambda e: chat)(ex)
    assert block == "<think>\n\n</think>\n\n" and text == chat + empty_think_block(chat, "qwen3")
    text, block = no_reasoning_prompt(lambda e: "Q <think>", style="qwen3")(ex)
    assert text == "Q <think>" + empty_think_block("Q <think>", "qwen3")

    examples, script = _examples(4, kinds=("trivial", "always", "half", "never"))
    counts = estimate_pass_rates(ScriptedPolicy(script), _task(), examples, SamplingSpec(n=2, seed=0),
                                 prompt=no_reasoning_prompt(_task().prompt))
    assert counts.correct == [2, 0, 0, 0]  # only the trivial problem is solved without reasoning


# ------------------------------------------------------------------------------------- curriculum


def test_curriculum_weights_favour_rates_near_one_half():
    # variance: 4 r (1 - r) + floor -> [0.05, 1.05, 0.05, 0.8, 1.05 (unknown = target 0.5)] / 3.0
    w = curriculum_weights([0.0, 0.5, 1.0, 0.25, None], floor=0.05)
    assert w == pytest.approx([0.05 / 3, 1.05 / 3, 0.05 / 3, 0.8 / 3, 1.05 / 3])
    assert sum(w) == pytest.approx(1.0)
    # triangle around 0.25: 1 - |r - 0.25| / 0.75, no floor
    assert curriculum_weights([0.25, 1.0, 0.0], shape="triangle", target=0.25, floor=0.0) == pytest.approx(
        [1 / (1 + 0 + 2 / 3), 0.0, (2 / 3) / (1 + 2 / 3)])
    assert curriculum_weights([0.0, 1.0], shape="uniform") == [0.5, 0.5]
    assert curriculum_weights([None, 0.0], unknown=0.0, floor=0.1) == [0.5, 0.5]
    with pytest.raises(ValueError, match="known: variance, triangle, uniform"):
        curriculum_weights([0.5], shape="gauss")
    with pytest.raises(ValueError, match="raise floor"):
        curriculum_weights([0.0, 1.0], floor=0.0)

    rng = random.Random(0)
    draws = [curriculum_sample(w, 2, rng) for _ in range(2000)]
    assert all(len(set(d)) == 2 for d in draws)  # without replacement
    freq = [sum(i in d for d in draws) for i in range(5)]
    assert freq[1] > freq[3] > freq[0] and freq[4] > freq[2]
    assert curriculum_sample([0.0, 1.0, 1.0], 2, random.Random(1)) in ([1, 2], [2, 1])
    with pytest.raises(ValueError, match="only 2 have weight > 0"):
        curriculum_sample([0.0, 1.0, 1.0], 3, rng)
    assert len(curriculum_sample(w, 10, rng, replace=True)) == 10


# -------------------------------------------------------------------------------- decontamination

EVAL = [
    {"id": "test/1", "question": "A farmer has 17 sheep and buys 5 more each week for 6 weeks. "
                                 "How many sheep does the farmer have after the sixth week ends?"},
    {"id": "test/2", "question": "What is 2^10 mod 7?"},
    {"id": "test/3", "question": "Lena reads 12 pages on Monday, twice as many on Tuesday and half as "
                                 "many on Wednesday as on Tuesday. How many pages did she read in total?"},
    {"id": "test/4", "question": "Express your answer as a common fraction: what is 3/4 of 2/9?"},
]


def _train_problems():
    q = [
        # planted: test/1 with case, punctuation and spacing changed (the same words)
        ("train/copy", "a FARMER has 17 sheep,  and buys 5 more each week for 6 weeks -- how many sheep "
                       "does the farmer have after the sixth week ends"),
        ("train/clean-1", "Tom has 3 apples and eats one of them every day. When are they gone?"),
        # planted: test/3 with "twice" reworded in the middle: 29 words, 22 8-grams; the 8 that hold
        # "three" or "times" are not in test/3, the other 14 are: overlap 14/22
        ("train/edit", "Lena reads 12 pages on Monday, three times as many on Tuesday and half as many on "
                       "Wednesday as on Tuesday. How many pages did she read in total?"),
        # shares exactly one 8-gram ("buys 5 more each week for 6 weeks") with test/1: 23 words, 1/16
        ("train/one-ngram", "Each baker buys 5 more each week for 6 weeks, then sells 40 loaves a day to the "
                            "town market for a month."),
        # planted: a short problem (fewer than 8 words: one gram, all of it) equal to test/2 up to case
        ("train/short", "what is 2^10 MOD 7"),
        # shares only the 7-word phrase "express your answer as a common fraction" with test/4
        ("train/boilerplate", "Express your answer as a common fraction. Find 5/6 of 3/10."),
        ("train/clean-2", "What is 3^10 mod 11?"),
    ]
    return [{"id": i, "question": t} for i, t in q]


def test_decontamination_drops_exactly_the_planted_near_duplicates_and_names_their_matches():
    train = _train_problems()
    result = decontaminate(train, EVAL)  # defaults: 8-grams, overlap >= 0.5
    assert result.n == 8 and result.threshold == 0.5
    assert [ex["id"] for ex in result.dropped] == ["train/copy", "train/edit", "train/short"]
    assert [m.eval_id for m in result.matches] == ["test/1", "test/3", "test/2"]
    assert [ex["id"] for ex in result.kept] == ["train/clean-1", "train/one-ngram", "train/boilerplate",
                                                "train/clean-2"]
    assert result.kept_indices == [1, 3, 5, 6]
    copy, edit, short = result.matches
    assert copy.overlap == 1.0 and copy.index == 0 and copy.eval_index == 0
    assert copy.eval_text.startswith("A farmer has 17 sheep") and copy.text.startswith("a FARMER has")
    assert (edit.shared, edit.overlap) == (14, pytest.approx(14 / 22)) and edit.index == 2
    assert edit.ngram == "and half as many on wednesday as on"  # the first shared 8-gram in sorted order
    assert (short.overlap, short.shared, short.ngram) == (1.0, 1, "what is 2 10 mod 7")
    # threshold 0: any shared 8-gram (GPT-3's rule) also drops the long problem that shares one
    strict = decontaminate(train, EVAL, threshold=0.0)
    assert [ex["id"] for ex in strict.dropped] == ["train/copy", "train/edit", "train/one-ngram", "train/short"]
    one = decontaminate([train[3]], EVAL, threshold=0.0).matches[0]
    assert (one.shared, one.overlap, one.ngram) == (1, pytest.approx(1 / 16), "buys 5 more each week for 6 weeks")
    # 7-grams catch the boilerplate phrase (1 of the problem's 7 7-grams)
    seven = decontaminate(train, EVAL, n=7, threshold=0.0)
    assert "train/boilerplate" in [ex["id"] for ex in seven.dropped]


def test_ngrams_normalize_case_punctuation_and_keep_short_texts_whole():
    assert ngrams("What is 2+3?", 8) == {("what", "is", "2", "3")}
    assert ngrams("a b c d", 2) == {("a", "b"), ("b", "c"), ("c", "d")}
    assert ngrams("  ", 8) == set()
    with pytest.raises(ValueError, match="n-gram size must be >= 1"):
        ngrams("a", 0)
    with pytest.raises(ValueError, match=r"threshold must be in \[0, 1\]"):
        decontaminate([], [], threshold=2)


# ------------------------------------------------------------------------------------- the command


def _invoke(*args):
    return CliRunner().invoke(app, ["filter", *args])


TINY = ["model.hidden_size=16", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=32"]
DATA = ["data.task=arithmetic", "data.digits=2", "data.num_train=12", "data.seed=5"]


@pytest.fixture
def scripted(monkeypatch):
    """`rlvr filter` samples from a ScriptedPolicy (the hf backend's builder is replaced): problem i
    of the command's training set (DATA) is of kind KINDS[i % 3]; returns the policy."""
    from rlvr.rollout.builder import GENERATOR_BACKENDS

    examples = get_task("arithmetic").generate(12, "train", 5, digits=2, operands=2)
    script = {ex.question: (KINDS[i % 3], ex.reference) for i, ex in enumerate(examples)}
    policy = ScriptedPolicy(script)
    policy.examples = examples
    monkeypatch.setitem(GENERATOR_BACKENDS, "hf", lambda *a, **kw: policy)
    return policy


def _load_back(path: Path, task: str = "arithmetic"):
    return load_task_data(DataConfig(task=task, train_path=str(path), num_train=0, num_eval=0)).train


def _same(a, b) -> bool:
    return [(e.id, e.question, e.reference) for e in a] == [(e.id, e.question, e.reference) for e in b]


def test_filter_command_keeps_the_medium_band_and_writes_dataset_histogram_and_report(scripted, tmp_path):
    out = tmp_path / "medium"
    r = _invoke(*TINY, *DATA, "--k", "4", f"run.out_dir={out}")
    assert r.exit_code == 0, r.output
    half = [ex for i, ex in enumerate(scripted.examples) if i % 3 == 1]
    assert _same(_load_back(out / "train.jsonl"), half)  # exactly the half-solved problems, and it loads back
    assert "kept 4 of 12 (band (0, 1): 4 below, 4 above)" in r.output
    assert (out / "histogram.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((out / "report.json").read_text())
    assert report["counts"] == {"problems": 12, "multiple_choice": 0, "contaminated": 0, "solved_without_reasoning": 0, "sampled": 12,
                                "below_band": 4, "above_band": 4, "kept": 4}
    assert report["pass_rates"]["never_solved"] == report["pass_rates"]["medium"] == 4
    assert [(b["correct"], b["count"], b["kept"]) for b in report["bins"]] == [
        (0, 4, 0), (1, 0, 0), (2, 4, 4), (3, 0, 0), (4, 4, 0)]
    assert report["settings"]["band"] == "(0, 1)" and report["settings"]["k"] == 4
    md = (out / "report.md").read_text()
    assert "| kept | 4 |" in md and "| 2/4 | 0.500 | 4 | 4 |" in md
    rows = [json.loads(x) for x in (out / "pass_rates.jsonl").read_text().splitlines()]
    assert [row["status"] for row in rows[:3]] == ["above band", "kept", "below band"]
    assert rows[1]["correct"] == 2 and rows[1]["pass_rate"] == 0.5
    # the output directory is not overwritten by accident
    again = _invoke(*TINY, *DATA, f"run.out_dir={out}")
    assert again.exit_code == 2 and "run.overwrite=true" in again.output


def test_filter_command_never_solved_band_decontamination_and_no_reasoning(scripted, tmp_path):
    examples = scripted.examples
    # problems 3 (always) and 5 (never) reappear in an evaluation file; problem 0 is solved without reasoning
    scripted.script[examples[0].question] = ("trivial", examples[0].reference)
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text("\n".join(json.dumps({"unique_id": f"held/{i}", "problem": examples[i].question})
                                   for i in (3, 5)) + "\n")
    out = tmp_path / "unsolved"
    r = _invoke(*TINY, *DATA, "--k", "4", "--band", "never-solved", "--decontaminate-against", str(eval_file),
                "--no-reasoning-k", "2", f"run.out_dir={out}")
    assert r.exit_code == 0, r.output
    never = [ex for i, ex in enumerate(examples) if i % 3 == 2 and i != 5]
    assert _same(_load_back(out / "train.jsonl"), never)
    report = json.loads((out / "report.json").read_text())
    assert report["counts"] == {"problems": 12, "multiple_choice": 0, "contaminated": 2, "solved_without_reasoning": 1, "sampled": 9,
                                "below_band": 0, "above_band": 6, "kept": 3}
    matches = report["decontamination"]["matches"]
    assert [(m["id"], m["eval_id"], m["eval_source"]) for m in matches] == [
        (examples[3].id, "held/3", str(eval_file)), (examples[5].id, "held/5", str(eval_file))]
    assert "held/3" in (out / "report.md").read_text()
    # dropped problems are not sampled: contaminated ones never, the trivial one only without reasoning
    sampled = [p for prompts, _ in scripted.calls for p in prompts]
    assert not any(examples[i].question in p for p in sampled for i in (3, 5))
    assert sum(examples[0].question in p for p in sampled) == 1
    rows = [json.loads(x) for x in (out / "pass_rates.jsonl").read_text().splitlines()]
    assert rows[0]["status"] == "solved without reasoning" and rows[0]["no_reasoning_correct"] == 2
    assert rows[3]["status"] == "contaminated" and rows[3]["eval_id"] == "held/3"


def test_a_file_task_keeps_its_rows_and_ids(scripted, tmp_path, monkeypatch):
    # GSM8K rows without an id are numbered by line; filtered rows keep their ids by an added "id"
    rows = [{"question": f"Sam has {i} pens and buys {i + 1}. How many now?", "answer": f"{i}+{i + 1}\n#### {2 * i + 1}"}
            for i in range(6)]
    src = tmp_path / "gsm.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    original = _load_back(src, "gsm8k")
    scripted.script.update({ex.question: (KINDS[i % 3], f"#### {ex.reference}") for i, ex in enumerate(original)})
    out = tmp_path / "gsm"
    r = _invoke(*TINY, "data.task=gsm8k", "data.template=question_only", f"data.train_path={src}", "--k", "2", "--band", "not-always-solved",
                f"run.out_dir={out}")
    assert r.exit_code == 0, r.output
    kept = [ex for i, ex in enumerate(original) if i % 3 != 0]
    assert _same(_load_back(out / "train.jsonl", "gsm8k"), kept)
    written = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    assert written[0] == {**rows[1], "id": "gsm8k:1"}  # the row as read, plus its id


def test_filter_command_with_a_real_tiny_model(tmp_path):
    out = tmp_path / "tiny"
    r = _invoke(*TINY, "data.digits=1", "data.num_train=6", "data.num_eval=4", "sampling.max_tokens=2", "--k", "2",
                "--band", "all", "--decontaminate-against", "eval", f"run.out_dir={out}")
    assert r.exit_code == 0, r.output
    assert len(_load_back(out / "train.jsonl")) == 6
    report = json.loads((out / "report.json").read_text())
    # synthetic splits never share a problem: nothing is contaminated by the task's own held-out split
    assert report["counts"]["sampled"] == 6 and report["decontamination"]["dropped"] == 0
    assert sum(b["count"] for b in report["bins"]) == 6


def test_filter_errors_name_the_option_key_or_file(tmp_path):
    r = _invoke("--band", "hard")
    assert r.exit_code == 2 and "--band band 'hard': expected a name" in r.output
    r = _invoke("--k", "0")
    assert r.exit_code == 2 and "--k 0" in r.output
    r = _invoke("--overlap", "1.5")
    assert r.exit_code == 2 and "--overlap 1.5" in r.output
    r = _invoke("data.task=gsm8k", f"data.train_path={tmp_path / 'missing.jsonl'}")
    assert r.exit_code == 2 and "data.train_path" in r.output and "missing.jsonl" in r.output
    r = _invoke("data.num_train=4", "--decontaminate-against", str(tmp_path / "none.jsonl"),
                f"run.out_dir={tmp_path / 'o'}")
    assert r.exit_code == 2 and "--decontaminate-against" in r.output and "none.jsonl: no such file" in r.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "x"}\n')
    r = _invoke("data.num_train=4", "--decontaminate-against", str(bad), f"run.out_dir={tmp_path / 'o'}")
    assert r.exit_code == 2 and f"{bad}:1: no \"question\", \"problem\" or \"prompt\" key (has: text)" in r.output
    r = _invoke("data.task=gsm8k", "data.num_train=4", "--decontaminate-against", "eval",
                f"run.out_dir={tmp_path / 'o'}")
    assert r.exit_code == 2 and "data.train_path is required" in r.output
    assert "loading model" not in r.output
    # run.out_dir/train.jsonl must not be the file being filtered
    src2 = tmp_path / "train.jsonl"
    src2.write_text('{"question": "1+1=", "reference": "2"}\n')
    r = _invoke(f"data.train_path={src2}", f"run.out_dir={tmp_path}", "run.overwrite=true")
    assert r.exit_code == 2 and "is data.train_path itself" in r.output


def test_filter_problems_is_the_command_as_a_library_function_of_its_config(scripted, tmp_path):
    """The flags are aliases of filter.* keys: a YAML `filter:` section, the library call and the flags give the
    same dataset; a flag wins over the file."""
    from rlvr.config import ConfigError, load_config
    from rlvr.train.config import FilterConfig
    from rlvr.train.filtering import filter_problems

    cfg = load_config(FilterConfig, None, [*TINY, *DATA, "filter.k=4", "filter.band=never-solved",
                                           f"run.out_dir={tmp_path / 'lib'}"])
    result = filter_problems(cfg)
    never = [ex for i, ex in enumerate(scripted.examples) if i % 3 == 2]
    assert result.kept == 4 and result.problems == 12 and result.dataset == tmp_path / "lib" / "train.jsonl"
    assert _same(_load_back(result.dataset), never)
    assert result.report["settings"]["k"] == 4 and result.report["settings"]["band"] == "[0, 0]"
    # the same from a YAML file, with a flag over the file's band
    path = tmp_path / "filter.yaml"
    path.write_text("filter: {k: 4, band: medium}\n")
    r = _invoke(str(path), *TINY, *DATA, "--band", "never-solved", f"run.out_dir={tmp_path / 'cli'}")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "cli" / "train.jsonl").read_text() == result.dataset.read_text()
    # the key's checks name the key and the flag
    with pytest.raises(ConfigError, match=r"filter\.overlap / --overlap 2"):
        load_config(FilterConfig, None, ["filter.overlap=2"])
    with pytest.raises(ConfigError, match=r"filter\.no_reasoning_k / --no-reasoning-k -1"):
        load_config(FilterConfig, None, ["filter.no_reasoning_k=-1"])


def test_drop_multiple_choice_drops_only_option_questions_before_sampling_and_decontaminates_the_rest(
        scripted, tmp_path):
    # GSM8K-format rows: 1 and 3 are multiple choice, 4 reappears in an evaluation file (its index must survive
    # the multiple-choice rows dropped before it), the others are kept; every question is "always" solved
    qs = ["Sam has 3 pens and buys 4. How many pens does Sam have now?",
          "Which of the following is 3 + 4?\n(A) 6\n(B) 7\n(C) 8",
          "A farmer has 5 cows and buys 2 more cows at the market. How many cows now?",
          "How many legs do 2 dogs have?\nA. 4\nB. 8\nC. 6",
          "Mia reads 12 pages on Monday and 15 pages on Tuesday of her long book. How many pages in all?",
          "Tom had 9 apples and ate 2 (a) at lunch and (b) at dinner. How many are left?"]
    answers = ["7", "B", "7", "B", "27", "7"]
    src = tmp_path / "gsm.jsonl"
    src.write_text("".join(json.dumps({"question": q, "answer": f"#### {a}"}) + "\n" for q, a in zip(qs, answers, strict=True)))
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text(json.dumps({"id": "held/4", "question": qs[4]}) + "\n")
    original = _load_back(src, "gsm8k")
    scripted.script.update({ex.question: ("always", f"#### {ex.reference}") for ex in original})
    out = tmp_path / "mc"
    r = _invoke(*TINY, "data.task=gsm8k", "data.template=question_only", f"data.train_path={src}", "--k", "2",
                "--band", "all", "--drop-multiple-choice", "--decontaminate-against", str(eval_file),
                f"run.out_dir={out}")
    assert r.exit_code == 0, r.output
    assert "multiple choice: dropped 2 of 6" in r.output
    assert _same(_load_back(out / "train.jsonl", "gsm8k"), [original[i] for i in (0, 2, 5)])
    report = json.loads((out / "report.json").read_text())
    assert report["counts"] == {"problems": 6, "multiple_choice": 2, "contaminated": 1, "solved_without_reasoning": 0,
                                "sampled": 3, "below_band": 0, "above_band": 0, "kept": 3}
    rows = [json.loads(x) for x in (out / "pass_rates.jsonl").read_text().splitlines()]
    assert [row["status"] for row in rows] == ["kept", "multiple choice", "kept", "multiple choice", "contaminated",
                                               "kept"]
    assert rows[1]["multiple_choice"] == "options (A)-(C)" and rows[4]["eval_id"] == "held/4"
    assert "| dropped: multiple choice | 2 |" in (out / "report.md").read_text()
    sampled = [p for prompts, _ in scripted.calls for p in prompts]
    assert not any(qs[i] in p for p in sampled for i in (1, 3, 4))  # dropped problems cost no sampling
    # off by default: the same command without the flag keeps the option questions
    r = _invoke(*TINY, "data.task=gsm8k", "data.template=question_only", f"data.train_path={src}", "--k", "2",
                "--band", "all", f"run.out_dir={tmp_path / 'all'}")
    assert r.exit_code == 0 and len(_load_back(tmp_path / "all" / "train.jsonl", "gsm8k")) == 6
