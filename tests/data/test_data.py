"""Examples, JSONL validation, task loaders, templates, synthetic tasks and their held-out splits."""

import json
import re
from pathlib import Path

import pytest
from helpers.shared_data import needs_shared, require_shared, shared_path

from rlvr.data import (
    DataError,
    Example,
    get_task,
    load_gsm8k,
    load_math,
    load_sft,
    read_jsonl,
    render_prompt,
    sft_examples,
    template_text,
)
from rlvr.data.tasks.arithmetic import evaluate
from rlvr.data.tasks.synthetic import ProblemSpaceError, split_of

SHARED = shared_path("data")  # ../shared/data: development data a clone does not have


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_jsonl_errors_name_file_and_line(tmp_path):
    good = json.dumps({"question": "q", "answer": "#### 1"})
    p = _write(tmp_path / "x.jsonl", [good, "", good, json.dumps({"question": "q"})])
    # blank line 2 is skipped; the bad row is on line 4
    with pytest.raises(DataError, match=re.escape(f'{p}:4: missing key "answer"')):
        load_gsm8k(p)
    p = _write(tmp_path / "y.jsonl", [good, "{not json"])
    with pytest.raises(DataError, match=re.escape(f"{p}:2: invalid JSON")):
        read_jsonl(p, ("question",))
    p = _write(tmp_path / "z.jsonl", ["[1, 2]"])
    with pytest.raises(DataError, match=re.escape(f"{p}:1: expected a JSON object, got list")):
        read_jsonl(p)
    p = _write(tmp_path / "w.jsonl", [json.dumps({"question": ["a"], "answer": "#### 1"})])
    with pytest.raises(
        DataError, match=re.escape(f'{p}:1: key "question" must be a string or number, got list')
    ):
        load_gsm8k(p)
    with pytest.raises(DataError, match="no such file"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_gsm8k_reference_after_hashes_commas_stripped(tmp_path):
    rows = [
        {"question": " How many? ", "answer": "2 + 3 = <<2+3=5>>5 apples\n#### 5"},
        {"question": "Big?", "answer": "lots\n#### 1,234,567"},
        {"question": "Neg?", "answer": "#### -3.5"},
    ]
    p = _write(tmp_path / "g.jsonl", [json.dumps(r) for r in rows])
    ex = load_gsm8k(p)
    assert [e.reference for e in ex] == ["5", "1234567", "-3.5"]
    assert ex[0].question == "How many?" and ex[0].solution == "2 + 3 = 5 apples"  # calculator notes removed
    bad = _write(
        tmp_path / "b.jsonl", [json.dumps(rows[0]), json.dumps({"question": "q", "answer": "no marker"})]
    )
    with pytest.raises(DataError, match=re.escape(f"{bad}:2: GSM8K answer has no '####'")):
        load_gsm8k(bad)


@needs_shared("data", "gsm8k", "test.jsonl")
def test_gsm8k_shared_test_file_loads():
    ex = load_gsm8k(SHARED / "gsm8k" / "test.jsonl")
    assert len(ex) == 1319
    assert ex[0].reference == "18"  # Janet's ducks: (16 - 3 - 4) * 2 = 18
    assert all("," not in e.reference and e.reference for e in ex)


def test_math_reference_from_last_boxed_or_answer(tmp_path):
    rows = [
        {"problem": "p1", "solution": "first \\boxed{1} then \\boxed{\\frac{1}{2}}", "level": "Level 2"},
        {"problem": "p2", "solution": "irrelevant \\boxed{9}", "answer": "3"},
        {"question": "p3", "solution": "x = \\boxed{\\{1, 2\\}}"},
    ]
    p = _write(tmp_path / "m.jsonl", [json.dumps(r) for r in rows])
    ex = load_math(p)
    assert [e.reference for e in ex] == ["\\frac{1}{2}", "3", "\\{1, 2\\}"]
    assert ex[0].meta["level"] == "Level 2"
    bad = _write(
        tmp_path / "mb.jsonl", [json.dumps(rows[0]), json.dumps({"problem": "p", "solution": "no box"})]
    )
    with pytest.raises(DataError, match=re.escape(f"{bad}:2: solution has no \\boxed{{}}")):
        load_math(bad)


# issue 36, item 6: an answer no response can match ("" -> "", NaN -> "nan", true -> "True") is refused
BAD_MATH_ANSWERS = [
    ('""', "'answer' is empty"),
    ('"   "', "'answer' is empty (only whitespace)"),
    ("NaN", "'answer' is nan, not a finite number"),
    ("Infinity", "'answer' is inf, not a finite number"),
    ("-Infinity", "'answer' is -inf, not a finite number"),
    ("true", "'answer' must be a string or a number, got bool True"),
    ('{"a": 1}', "'answer' must be a string or a number, got dict {'a': 1}"),
    ("[1, 2]", "'answer' must be a string or a number, got list [1, 2]"),
]


@pytest.mark.parametrize(("answer", "message"), BAD_MATH_ANSWERS)
def test_math_refuses_an_answer_that_can_never_be_scored(tmp_path, answer, message):
    good = json.dumps({"problem": "1+1?", "answer": "2"})
    p = _write(tmp_path / "m.jsonl", [good, '{"problem": "2+2?", "answer": ' + answer + "}"])
    with pytest.raises(DataError, match=re.escape(f"{p}:2: {message}")):
        load_math(p)


def test_math_accepts_numbers_and_non_empty_strings_as_answers(tmp_path):
    rows = ['{"problem": "a", "answer": 3}', '{"problem": "b", "answer": 0.5}', '{"problem": "c", "answer": -2}',
            '{"problem": "d", "answer": "  \\\\frac{1}{2} "}', '{"problem": "e", "answer": 0}',
            '{"problem": "f", "answer": null, "solution": "so \\\\boxed{4}"}']
    p = _write(tmp_path / "m.jsonl", rows)
    assert [e.reference for e in load_math(p)] == ["3", "0.5", "-2", "\\frac{1}{2}", "0", "4"]


def test_math_bad_answers_are_refused_before_the_model_loads_naming_every_line(tmp_path):
    """check_data_files (what `rlvr train` / `rlvr eval` run before loading the model) names the key, the file
    and each bad line."""
    from rlvr.train.config import DataConfig
    from rlvr.train.tasks import TaskDataError, check_data_files

    lines = ['{"problem": "p", "answer": "1"}'] + ['{"problem": "p", "answer": ' + a + "}" for a, _ in BAD_MATH_ANSWERS]
    p = _write(tmp_path / "train.jsonl", lines)
    with pytest.raises(TaskDataError) as exc:
        check_data_files(DataConfig(task="math", train_path=str(p)))
    msg = str(exc.value)
    assert msg.startswith(f"data.train_path={p}: {len(BAD_MATH_ANSWERS)} bad lines of {len(lines)}"), msg
    assert "line 2: 'answer' is empty" in msg and "line 4: 'answer' is nan" in msg, msg


@pytest.mark.parametrize("value", ["", " \t", float("nan"), float("inf"), True, {"a": 1}])
def test_math_hf_records_with_a_bad_answer_name_dataset_split_and_row(value):
    task = get_task("math")
    rows = [{"problem": "p", "answer": "1"}, {"problem": "q", "answer": value}]
    with pytest.raises(DataError, match=re.escape("user/math-set[train]:1: 'answer' ")):
        task.from_rows(rows, source="user/math-set[train]")


def test_math_hf_dataset_on_disk_with_a_nan_answer_is_refused(tmp_path):
    """load_hf (data.hf_dataset) on a saved dataset whose float answer column holds a NaN (a missing value)."""
    datasets = pytest.importorskip("datasets")
    from rlvr.data import load_hf

    folder = tmp_path / "ds"
    datasets.Dataset.from_list([{"problem": "p", "answer": 1.5}, {"problem": "q", "answer": float("nan")}]) \
        .save_to_disk(str(folder))
    with pytest.raises(DataError, match=re.escape(f"{folder}[train]:1: 'answer' is nan, not a finite number")):
        load_hf("math", str(folder), "train")


def test_sft_loader(tmp_path):
    p = _write(
        tmp_path / "s.jsonl", [json.dumps({"prompt": "1+1=", "response": "2"}), json.dumps({"prompt": "x"})]
    )
    with pytest.raises(DataError, match=re.escape(f'{p}:2: missing key "response"')):
        load_sft(p)
    p = _write(tmp_path / "s2.jsonl", [json.dumps({"prompt": "1+1=", "response": "2", "id": "a"})])
    assert [(s.prompt, s.response, s.id) for s in load_sft(p)] == [("1+1=", "2", "a")]


def test_sft_loader_refuses_an_empty_file_and_errors_carry_their_parts(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(DataError, match=re.escape(f"{empty}: no prompt/response pairs")) as info:
        load_sft(empty)
    assert (info.value.path, info.value.line) == (str(empty), None)
    bad = _write(tmp_path / "bad.jsonl", [json.dumps({"prompt": "a", "response": "b"}), "{oops"])
    with pytest.raises(DataError) as info:
        load_sft(bad)
    assert (info.value.path, info.value.line) == (str(bad), 2)
    assert info.value.reason.startswith("invalid JSON") and str(info.value).startswith(f"{bad}:2: invalid JSON")
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"prompt": "caf\xe9", "response": "x"}\n')
    with pytest.raises(DataError, match="not UTF-8 text"):
        load_sft(latin)
    with pytest.raises(DataError, match="is a directory"):
        load_sft(tmp_path)


@needs_shared("data", "prompts")
def test_templates_packaged_equal_shared():
    for name in ("r1_zero", "question_only"):
        assert template_text(name) == (SHARED / "prompts" / f"{name}.prompt").read_text()


def test_templates_render():
    q = "What is {x} + \\frac{1}{2}?"  # braces must survive (no str.format)
    r1 = render_prompt(q, "r1_zero")
    assert r1.endswith(f"User: {q}\nAssistant: <think>")
    assert render_prompt(q, "question_only") == q
    assert render_prompt("7*8=", "Q: {question} A:") == "Q: 7*8= A:"
    with pytest.raises(KeyError, match="unknown prompt template 'nope'; known: chat, question_only, r1_zero"):
        render_prompt(q, "nope")


def test_r1_zero_prompt_round_trips_through_tiny_tokenizer_and_chat_template():
    from rlvr.models import build_char_tokenizer

    tok = build_char_tokenizer()
    prompt = render_prompt("What is 12+345?", "r1_zero")
    target = get_task("arithmetic").target(Example("a", "12+345=", "357"), "r1_zero")
    for text in (prompt, prompt + target):
        ids = tok.encode(text)
        assert tok.decode(ids) == text and tok.unk_token_id not in ids
    assert render_prompt("1+1", "chat", tok) == "<|user|>1+1\n<|assistant|>"
    with pytest.raises(ValueError, match="needs a tokenizer"):
        render_prompt("1+1", "chat")


def test_task_registry_and_reward_names():
    with pytest.raises(
        KeyError, match="unknown task 'nope'; known: arithmetic, (code, )?countdown, gsm8k, math"
    ):
        get_task("nope")
    assert get_task("gsm8k").reward_name("r1_zero") == "r1_zero"
    assert get_task("gsm8k").reward_name("question_only") == "gsm8k"
    assert get_task("arithmetic").reward_name() == "arithmetic"
    assert get_task("countdown").reward_name("r1_zero") == "countdown"
    assert get_task("math").reward_name("question_only") == "question_only"


def test_arithmetic_evaluate_hand_computed():
    assert evaluate([2, 3, 4], ["+", "*"]) == 14  # 2 + 12
    assert evaluate([10, 2, 3], ["-", "-"]) == 5  # (10 - 2) - 3, left to right
    assert evaluate([12, 4], ["/"]) == 3
    assert evaluate([2, 3, 4, 5], ["*", "-", "*"]) == -14  # 6 - 20
    with pytest.raises(ValueError):
        evaluate([7, 2], ["/"])


def _independent_value(question: str) -> int:
    # Our own generated strings only (digits and + - * /, checked by the regex): safe to eval.
    assert re.fullmatch(r"[0-9+\-*/]+=", question)
    return eval(question[:-1].replace("/", "//"), {"__builtins__": {}})


def test_arithmetic_generation_deterministic_correct_and_compact():
    task = get_task("arithmetic")
    a = task.generate(300, "train", seed=1, digits=(1, 3), ops="+-*", operands=3)
    b = task.generate(300, "train", seed=1, digits=(1, 3), ops="+-*", operands=3)
    c = task.generate(300, "train", seed=2, digits=(1, 3), ops="+-*", operands=3)
    assert [e.question for e in a] == [e.question for e in b]
    assert [e.question for e in a] != [e.question for e in c]
    assert len({e.question for e in a}) == 300
    for e in a:
        assert int(e.reference) == _independent_value(e.question) >= 0
        assert len(e.question) <= 12  # 3 operands of <= 3 digits + 2 ops + "="
    d = task.generate(100, "test", seed=0, digits=2, ops="/")
    for e in d:
        x, y = e.question[:-1].split("/")
        assert int(x) == int(y) * int(e.reference) and 10 <= int(y) <= 99


def test_synthetic_train_and_heldout_never_overlap():
    task = get_task("arithmetic")
    train = {e.question for s in (0, 1) for e in task.generate(2000, "train", seed=s, digits=2)}
    test = {e.question for s in (0, 5) for e in task.generate(200, "test", seed=s, digits=2)}
    assert train and test and not (train & test)
    assert all(split_of(q, 0.1) == "test" for q in test)
    cd = get_task("countdown")
    ctrain = {e.id for e in cd.generate(500, "train", seed=0)}
    ctest = {e.id for e in cd.generate(100, "test", seed=3)}
    assert not (ctrain & ctest)
    # 1-digit addition has 100 problems, 10 of them held out: 50 test problems cannot exist, and the
    # generator says so before drawing anything
    with pytest.raises(ProblemSpaceError, match="50 distinct test problems asked for, but only 10 exist"):
        task.generate(50, "test", seed=0, digits=1)


def test_countdown_always_solvable_by_its_own_checker():
    from rlvr.rewards import get_reward_fn

    reward = get_reward_fn("countdown")
    ex = get_task("countdown").generate(200, "train", seed=7, count=4, max_number=30, max_target=200)
    for e in ex:
        assert 1 <= e.meta["target"] <= 200 and len(e.meta["numbers"]) == 4
        r = reward(f"<answer>{e.solution}</answer>", e)
        assert r.total == 1.0, (e.meta, e.solution, r)
        # the solution uses exactly the given numbers
        assert sorted(int(x) for x in re.findall(r"\d+", e.solution)) == sorted(e.meta["numbers"])


@pytest.mark.parametrize(
    ("task_name", "template"),
    [
        ("arithmetic", "question_only"),
        ("arithmetic", "r1_zero"),
        ("countdown", "question_only"),
        ("countdown", "r1_zero"),
        ("gsm8k", "r1_zero"),
        ("gsm8k", "question_only"),
    ],
)
def test_task_sft_target_earns_full_reward_under_the_task_checker(task_name, template):
    # training reward and evaluation metric come from the task: its own gold target must pass
    task = get_task(task_name)
    if task.generate is not None:
        examples = task.generate(30, "train", seed=0)
    else:
        examples = load_gsm8k(require_shared("data", "gsm8k", "train.jsonl"))[:30]
    reward = task.reward_fn(template)
    pairs = sft_examples(examples, task_name, template)
    for ex, pair in zip(examples, pairs, strict=True):
        assert pair.prompt == task.prompt(ex, template)
        assert reward(pair.response, ex).total == 1.0, (pair.response, ex.reference)
        assert reward("<answer>-999999</answer> 12345", ex).total == 0.0


def test_stop_strings_per_template():
    assert get_task("gsm8k").stop_strings("r1_zero") == ("</answer>",)
    assert get_task("gsm8k").stop_strings("question_only") == ()
    assert get_task("arithmetic").stop_strings() == ()


def test_pass_rates_and_difficulty_filter():
    from types import SimpleNamespace

    from rlvr.data import filter_by_pass_rate, pass_rates

    task = get_task("arithmetic")
    examples = task.generate(3, "train", seed=0)
    # scripted generator: example 0 always right, 1 right once in 4, 2 never
    answers = {0: [1, 1, 1, 1], 1: [1, 0, 0, 0], 2: [0, 0, 0, 0]}

    class Scripted:
        def generate(self, prompts, spec):
            return [
                SimpleNamespace(group=i, text=examples[i].reference if answers[i][j] else "-1")
                for i in range(len(prompts))
                for j in range(spec.n)
            ]

    spec = SimpleNamespace(n=4)
    rates = pass_rates(Scripted(), examples, [task.prompt(e) for e in examples], task.reward_fn(), spec)
    assert rates == [1.0, 0.25, 0.0]
    assert filter_by_pass_rate(examples, rates) == [examples[1]]
    assert filter_by_pass_rate(examples, rates, low=0.3, high=1.0) == []  # 0.25 is not above low
    assert filter_by_pass_rate(examples, [0.5, 0.5, 0.0]) == examples[:2]
    with pytest.raises(ValueError, match="3 examples but 2 pass rates"):
        filter_by_pass_rate(examples, rates[:2])


def test_from_rows_for_hf_records_names_the_source():
    task = get_task("gsm8k")
    ex = task.from_rows([{"question": "q", "answer": "x\n#### 1,000"}], source="openai/gsm8k[test]")
    assert ex[0].reference == "1000"
    with pytest.raises(DataError, match=re.escape('openai/gsm8k[test]:1: missing key "answer"')):
        task.from_rows(
            [{"question": "q", "answer": "#### 1"}, {"question": "q"}], source="openai/gsm8k[test]"
        )


def test_math_target_earns_full_reward_under_math_checkers():
    task = get_task("math")
    rows = [
        {"problem": "Half of one?", "solution": "It is $\\boxed{\\frac{1}{2}}$."},
        {"problem": "Two plus two?", "solution": "So \\boxed{4}."},
    ]
    examples = task.from_rows(rows, source="mem")
    for template in ("r1_zero", "question_only"):
        reward = task.reward_fn(template)
        for ex in examples:
            assert reward(task.target(ex, template), ex).total == 1.0
            assert reward("<answer>7</answer> \\boxed{7}", ex).total == 0.0


# ------------------------------------------------------------------- problem-space capacity (issue 16)


@pytest.mark.parametrize(
    ("task", "knobs"),
    [
        ("arithmetic", {"digits": 1}),
        ("arithmetic", {"digits": 1, "ops": "+-*"}),
        ("arithmetic", {"digits": 1, "ops": "/"}),
        ("countdown", {"count": 2, "max_number": 6, "max_target": 20}),
        ("countdown", {"count": 3, "max_number": 4, "max_target": 30}),
        ("code", {"families": ("affine", "sum_multiples")}),
    ],
)
def test_capacity_is_exactly_what_the_generator_can_draw(task, knobs, monkeypatch):
    """capacity() counts the problem space by the generator's own rules: asking for exactly that
    many succeeds, and one more cannot be drawn (checked with the up-front refusal switched off)."""
    t = get_task(task)
    module = __import__(t.generate.__module__, fromlist=["check_capacity"])
    for split in ("train", "test"):
        cap = t.capacity(split, **knobs)
        assert cap and len({e.id for e in t.generate(cap, split, 0, **knobs)}) == cap
        with pytest.raises(ProblemSpaceError, match=f"only {cap} exist"):
            t.generate(cap + 1, split, 0, **knobs)
        with monkeypatch.context() as m:
            m.setattr(module, "check_capacity", lambda *a, **k: None)
            with pytest.raises(ValueError, match=f"found only {cap} distinct {split} problems"):
                t.generate(cap + 1, split, 0, **knobs)


def test_capacity_defaults_large_and_unbounded_spaces():
    # the demo's four 1-digit terms: 10**4 problems, 9006 of them in the training split
    assert get_task("arithmetic").capacity("train", digits=1, operands=4) == 9006
    # the default countdown generator makes 14665 distinct training problems (its default num_train
    # of 20000 used to fail after two minutes of drawing)
    assert get_task("countdown").capacity("train") == 14665
    # 3-digit addition: too many to count, estimated from the split's share
    assert get_task("arithmetic").capacity("train", digits=3) == 729_000
    # count_char and rotate draw random words and lists: unbounded
    assert get_task("code").capacity("train") is None
    assert get_task("countdown").capacity("train", count=5) is None  # too many multisets to enumerate


def test_code_family_keys_cover_every_draw():
    import random

    from rlvr.data.tasks.code import FAMILIES, FAMILY_KEYS

    rng = random.Random(0)
    for name, keys in FAMILY_KEYS.items():
        allowed = set(keys())
        drawn = {FAMILIES[name](rng)[0] for _ in range(20 * len(allowed))}
        assert drawn == allowed, name
