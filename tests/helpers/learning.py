"""Sizes of the partly trained policies the learning tests share (built once per session by the fixtures of
tests/conftest.py) and of the runs the tests start from them.

- arith3_task / arith3_sft_runs (tests/learning/test_train_learning.py, the recipe book, LoRA, distillation, vLLM):
  three single-digit terms ("3+5+7=" -> "15"), one SFT run per seed with checkpoints at steps 100 and 200.
- steps_task / steps_sft_runs (tests/rewards/test_process_rewards.py): the step-by-step task with every number one
  digit, one SFT run per seed stopped at step 75 of a 200-step cosine schedule.
"""

LEARN_SEEDS = (0, 1, 2)
LEARN_MODEL = ["model.hidden_size=64", "model.num_layers=2", "model.num_heads=4", "model.intermediate_size=128",
               "model.tie_embeddings=true"]
LEARN_COMMON = ["sampling.max_tokens=4", "data.num_eval=200", "run.num_threads=1", "run.progress=false"]
LEARN_SFT_STEPS, LEARN_RL_FROM_STEP = 200, 100

STEPS_LEARN_MODEL = ["model.hidden_size=128", "model.num_layers=2", "model.num_heads=4",
                     "model.intermediate_size=256", "model.tie_embeddings=true"]
STEPS_LEARN_COMMON = ["sampling.max_tokens=12", "run.num_threads=1", "run.progress=false"]
STEPS_SFT_STEPS, STEPS_RL_FROM_STEP = 200, 75
