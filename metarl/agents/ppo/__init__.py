"""PPO (feed-forward or recurrent, RL^2-style) in compile-once segments.

    space = make_train_space(env, PPOConfig(core="gru", num_envs=256))
    k_train, k_env = split_keys(jax.random.key(seed), 2)
    ts = init_training_state(space, k_train)
    es = init_env_state(space, k_env, context=narrow_space)
    for ranges in schedule:
        ts, es, metrics = run_train(space, ts, es, num_steps=200_000, context=ranges)

`make_train_space` builds and jits every function once; `run_train` calls
the same compiled iteration loop whatever `num_steps` or `context` is, so a
curriculum, checkpointing or evaluation runs between segments with no new XLA
compilation.

Modules: `config` (PPOConfig), `rollout` (EnvState, the unroll), `learner`
(TrainingState, critic, GAE, minibatch SGD, one iteration), `training` (the
compiled pieces), `policy` (inference).
"""

from metarl.agents.ppo.config import RETURNS_SPANS, PPOConfig
from metarl.agents.ppo.learner import TrainingState
from metarl.agents.ppo.policy import Policy, make_policy
from metarl.agents.ppo.rollout import EnvState, Transition
from metarl.agents.ppo.training import (
    TrainingDivergedError,
    TrainSpace,
    init_env_state,
    init_training_state,
    make_train_space,
    precompile,
    restock_env_state,
    run_train,
    seed_keys,
    select_seed,
    split_keys,
    thin_env_state,
    train,
)

__all__ = [
    "RETURNS_SPANS",
    "EnvState",
    "PPOConfig",
    "Policy",
    "TrainSpace",
    "TrainingDivergedError",
    "TrainingState",
    "Transition",
    "init_env_state",
    "make_train_space",
    "init_training_state",
    "make_policy",
    "precompile",
    "restock_env_state",
    "run_train",
    "seed_keys",
    "select_seed",
    "split_keys",
    "thin_env_state",
    "train",
]
