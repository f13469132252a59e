"""The RL learner: `rlvr train`'s policy-gradient loop and everything only it uses. No names are exported here
(each has one address, its module); `rlvr.train` exports `train` and `TrainConfig` for users.

    loop            train(cfg): the loop whose docstring is its pseudocode; validate_train_config, learn, Learner
    rollout_source  where a step's groups come from: generate-then-score, env episodes, sampling ahead, partial
    curriculum      which problems a step draws (the data stream, the online difficulty filters)
    objective       the loss of a step: Objective (shaping, advantages, targets), micro-batch losses, gradients
    targets         per-token advantages: KL in the reward, whitening, GAE returns for the critic
    process         per-step (process) rewards into token advantages
    critic          PPO's value model (shared trunk or separate)
    reference       the KL reference and a distillation teacher
    sharded         distributed.learner=fsdp2: the learner sharded over torchrun processes
    recipes         the named recipes (`--recipe grpo`) as AlgoConfig settings

It stands on the run kit (rlvr.train.session and the modules beside it) and the configs (rlvr.train.config);
the stages on top (sft, ei, distill, evaluation, filtering, pipeline, demo) import it, never the reverse
(tests/architecture/test_import_graph.py)."""
