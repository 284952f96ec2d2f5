"""Contextual Brax environments: a fresh physics context per episode or trial."""

from metarl.envs import toy  # noqa: F401  (registers the "puck" env)
from metarl.envs.autoreset import STRATEGIES as RESET_STRATEGIES
from metarl.envs.check import ContractError, check_env
from metarl.envs.contextual import CONTEXT, TRIAL, ContextualEnv, TrialInfo, make_contextual

__all__ = [
    "CONTEXT",
    "RESET_STRATEGIES",
    "TRIAL",
    "ContextualEnv",
    "ContractError",
    "TrialInfo",
    "check_env",
    "make_contextual",
]
