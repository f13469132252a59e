"""Issue 37, item 16, in-process: a reward function of the user's (data.reward / rlvr grade --reward) given as
"module:function" or verl's "path/to/file.py:function". A module that does not load (SyntaxError, TabError,
NameError at import) is one line naming the file and line, not an 80-line traceback; the working directory
is importable without PYTHONPATH=.; a float or bool return is a Reward (total = the number, CORRECT when > 0);
the one call made before the model loads refuses what no input excuses. The commands themselves:
tests/cli/test_cli_paths_rewards.py."""

from __future__ import annotations

import pickle
import sys

import pytest
import typer

from rlvr.config import ConfigError, load_config
from rlvr.rewards import Reward, Status
from rlvr.rewards.batch import resolve_reward_fn, score_batch
from rlvr.train.config import TrainConfig

BROKEN = {
    "syntax": ("def score(response, example)\n    return 1.0\n", 1, "SyntaxError"),
    "tabs": ("def score(response, example):\n\tif response:\n        return 1.0\n\treturn 0.0\n", 3, "TabError"),
    "name": ("import math\nX = undefined_name\ndef score(response, example):\n    return 1.0\n", 2, "NameError"),
    "inner_import": ("import no_such_module_rlvr_test\ndef score(response, example):\n    return 1.0\n", 1,
                     "ModuleNotFoundError"),
}


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A working directory that is not on sys.path, as `rlvr` (a console script) runs in one."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith(("rlvr_t16_", "rlvr_user_reward_"))]:
        del sys.modules[name]


@pytest.mark.parametrize("form", ["module", "file"])
@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_reward_module_that_does_not_load_is_one_line_naming_file_and_line(here, kind, form):
    text, line, error = BROKEN[kind]
    (here / f"rlvr_t16_{kind}.py").write_text(text)
    spec = f"rlvr_t16_{kind}:score" if form == "module" else f"./rlvr_t16_{kind}.py:score"
    with pytest.raises(ConfigError) as err:
        load_config(TrainConfig, None, [f"data.reward={spec}"])
    msg = str(err.value)
    assert "\n" not in msg and f"data.reward='{spec}'" in msg, msg
    assert f"rlvr_t16_{kind}.py:{line}: {error}" in msg, msg


def test_the_working_directory_is_importable_without_pythonpath(here):
    (here / "rlvr_t16_cwd.py").write_text("def score(response, example):\n    return 1.0\n")
    assert resolve_reward_fn("rlvr_t16_cwd:score")("x", None).total == 1.0


def test_verls_file_path_form(here):
    (here / "checks").mkdir()
    (here / "checks" / "my_checker.py").write_text(
        "def compute_score(response, example):\n    return float(response.strip() == example.reference)\n")
    fn = resolve_reward_fn("./checks/my_checker.py:compute_score")
    rewards = score_batch(fn, ["4", "5"], ["4", "4"])
    assert [(r.total, r.status) for r in rewards] == [(1.0, Status.CORRECT), (0.0, Status.INCORRECT)]
    assert score_batch("checks/my_checker.py:compute_score", ["4"], ["4"])[0].total == 1.0


def test_a_missing_file_or_function_is_named(here):
    with pytest.raises(ValueError, match=r"nope\.py: no such file"):
        resolve_reward_fn("./nope.py:score")
    (here / "rlvr_t16_some.py").write_text("def score(response, example):\n    return 1\n")
    with pytest.raises(AttributeError, match=r"has no function 'other'; it defines score"):
        resolve_reward_fn("rlvr_t16_some:other")


@pytest.mark.parametrize("value, total, status", [(0.5, 0.5, Status.CORRECT), (0, 0.0, Status.INCORRECT),
                                                  (True, 1.0, Status.CORRECT), (False, 0.0, Status.INCORRECT),
                                                  (-1.0, -1.0, Status.INCORRECT)])
def test_a_float_or_bool_return_is_a_reward(here, value, total, status):
    (here / "rlvr_t16_num.py").write_text(f"def score(response, example):\n    return {value!r}\n")
    (r,) = score_batch("rlvr_t16_num:score", ["x"], ["y"])
    assert (r.total, r.status, dict(r.parts)) == (total, status, {})


@pytest.mark.parametrize("value, word", [("None", "NoneType"), ("'1'", "str"), ("float('nan')", "nan")])
def test_a_return_that_is_no_reward_is_an_error_saying_so(here, value, word):
    (here / "rlvr_t16_bad.py").write_text(f"def score(response, example):\n    return {value}\n")
    (r,) = score_batch("rlvr_t16_bad:score", ["x"], ["y"])
    assert r.status is Status.ERROR and word in r.info, r


def test_a_users_reward_pickles_as_its_spec_for_isolated_workers(here):
    (here / "rlvr_t16_pick.py").write_text(
        "from rlvr.rewards.types import Reward, Status\n"
        "def score(response, example):\n    return Reward(2.0, {'a': 2.0}, Status.CORRECT)\n")
    fn = resolve_reward_fn(f"{here}/rlvr_t16_pick.py:score")
    again = pickle.loads(pickle.dumps(fn))
    assert again("x", None).total == 2.0
    (r,) = score_batch(fn, ["x"], ["y"], isolate=True, timeout_s=30)
    assert r.total == 2.0 and r.status is Status.CORRECT, r


# --- the one call before the model loads (rlvr.commands.config_cli.check_user_reward) -------------------


@pytest.mark.parametrize("body, needle", [
    ("    return undefined_thing\n", "rlvr_t16_call.py:2: NameError: name 'undefined_thing'"),
    ("    return example.answer\n", "rlvr_t16_call.py:2: AttributeError"),
    ("    return None\n", "returned NoneType, not a Reward, a float or a bool"),
])
def test_the_check_before_the_model_loads_refuses_a_broken_function(here, capsys, body, needle):
    from rlvr.commands.config_cli import check_user_reward

    (here / "rlvr_t16_call.py").write_text("def score(response, example):\n" + body)
    with pytest.raises(typer.Exit):
        check_user_reward("rlvr_t16_call:score")
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: data.reward='rlvr_t16_call:score': ") and needle in err and "\n" not in err, err


def test_the_check_refuses_a_function_that_takes_the_wrong_arguments(here, capsys):
    from rlvr.commands.config_cli import check_user_reward

    (here / "rlvr_t16_arity.py").write_text("def score(response):\n    return 1.0\n")
    with pytest.raises(typer.Exit):
        check_user_reward("rlvr_t16_arity:score")
    assert "cannot be called as score(response, example)" in capsys.readouterr().err


def test_the_check_leaves_input_dependent_errors_to_the_run(here, capsys):
    """A KeyError on the dummy example's empty meta may be right for the real examples: the run counts it."""
    from rlvr.commands.config_cli import check_user_reward

    (here / "rlvr_t16_meta.py").write_text("def score(response, example):\n    return example.meta['numbers'][0]\n")
    check_user_reward("rlvr_t16_meta:score")
    check_user_reward("r1_zero")  # a registered reward is not called
    assert capsys.readouterr().err == ""


def test_reward_records_are_unchanged_for_a_reward_return(here):
    (here / "rlvr_t16_rec.py").write_text(
        "from rlvr.rewards.types import Reward, Status\n"
        "def score(response, example):\n    return Reward(0.25, {'x': 0.25}, Status.UNPARSABLE, 'why')\n")
    assert resolve_reward_fn("rlvr_t16_rec:score")("r", None) == Reward(0.25, {"x": 0.25}, Status.UNPARSABLE, "why")
