"""What test files share, in one place (no test file imports another): `from helpers.X import ...`.

tests/ is on sys.path (pyproject.toml: [tool.pytest.ini_options] pythonpath), so `helpers` imports the same from
every folder of tests/; a subprocess that needs it (or `data.reward=helpers.dense_reward:letter_share`) gets
PYTHONPATH=TESTS. Modules:

- cli: the installed `rlvr` script in a subprocess (run_rlvr, cli_env, refused) and its TINY sizes;
- docs: the `rlvr` commands of the docs' fenced blocks, and the documented commands that learn (LEARNING_CASES);
- learning: the shared partly trained policies' sizes (the session fixtures of conftest.py build them);
- shared_data: the development data in ../shared (shared_path, needs_shared, require_shared);
- training: a tiny in-process trainer config (TINY), a task of problems always / never / sometimes solved;
- fake_vllm: a scripted stand-in `vllm` module (the adapter's tests, without an engine);
- vllm_engine: the real engine's tiny policy shape, a perturbed copy of a model, the sampler-trainer gap;
- trackers: the environment and sizes of the real-tracker runs;
- judge_server: a loopback OpenAI-compatible judge; dense_reward: a reward whose groups differ;
- gateway: the rollout gateway tests' stand-ins (a ChatML template for the character tokenizer, a spy on a
  Generator, a scripted Generator, the tiny chat policy);
- kill_driver, lonely_group: scripts the tests run by path (python tests/helpers/NAME.py).
"""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]  # tests/: put it on a subprocess's PYTHONPATH to import helpers
REPO = TESTS.parent  # the repository root
