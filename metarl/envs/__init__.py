"""Contextual environments (Brax, MuJoCo Playground, your own MJCF): a fresh context per
episode or trial."""

from metarl.envs import (
    goals,  # noqa: F401  (registers "reacher_goal")
    toy,  # noqa: F401  (registers the "puck" env)
)
from metarl.envs.autoreset import STRATEGIES as RESET_STRATEGIES
from metarl.envs.check import ContractError, check_env
from metarl.envs.contextual import (
    CONTEXT,
    DERIVED,
    POOL,
    TRIAL,
    ContextualEnv,
    ResetPool,
    ResetStock,
    TrialInfo,
    make_contextual,
    refill_stocks,
)
from metarl.envs.mjcf import MjcfEnv

__all__ = [
    "CONTEXT",
    "DERIVED",
    "RESET_STRATEGIES",
    "TRIAL",
    "ContextualEnv",
    "ContractError",
    "MjcfEnv",
    "POOL",
    "ResetPool",
    "ResetStock",
    "TrialInfo",
    "check_env",
    "make_contextual",
    "refill_stocks",
]
