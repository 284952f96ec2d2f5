"""`PPOConfig`: PPO hyperparameters, validated at construction."""

from __future__ import annotations

import dataclasses
import math
import numbers

from metarl.agents.distributions import ACTION_DISTRIBUTIONS
from metarl.agents.networks import CORES

RETURNS_SPANS = ("trial", "episode")
_POSITIVE_INTS = ("num_envs", "unroll_length", "num_minibatches", "num_updates_per_batch")
_FLOATS = (
    "learning_rate",
    "entropy_cost",
    "discounting",
    "gae_lambda",
    "clipping_epsilon",
    "value_loss_coef",
    "reward_scaling",
)
_BOOLS = ("normalize_observations", "rl2_inputs", "reset_every_episode")


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


# jax.random.key(seed) keeps the seed's low 32 bits: seeds 2**32 apart (or -1 and
# 2**32 - 1) would be the same run under two names.
SEEDS = range(2**32)


def divisors(n: int) -> list[int]:
    """The depths a stock of `n` steps' rollout can take (`PPOConfig.stock_depth`)."""
    return [d for d in range(1, n + 1) if n % d == 0]


def check_seeds(seed: int, num_seeds: int, what: str = "seed") -> None:
    """Seeds seed, ..., seed + num_seeds - 1 must be ints in `SEEDS`."""
    if not _is_int(seed):
        raise TypeError(f"{what} must be an int, got {seed!r}")
    last = seed + num_seeds - 1
    if seed < SEEDS.start or last >= SEEDS.stop:
        span = f"seed {seed}" if num_seeds == 1 else f"seeds {seed}..{last}"
        raise ValueError(
            f"{what}: {span} outside 0..{SEEDS.stop - 1}; jax.random.key keeps a seed's "
            "low 32 bits, so such a seed would repeat another one's run"
        )


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """PPO hyperparameters. Invalid values or combinations raise at construction
    (TypeError for a wrong type, ValueError for a bad value), naming the field."""

    num_envs: int = 256
    unroll_length: int = 20
    num_minibatches: int = 8
    num_updates_per_batch: int = 4
    learning_rate: float = 3e-4
    entropy_cost: float = 1e-2
    discounting: float = 0.97
    gae_lambda: float = 0.95
    clipping_epsilon: float = 0.3
    max_grad_norm: float | None = 1.0
    value_loss_coef: float = 0.5
    normalize_observations: bool = True
    reward_scaling: float = 1.0
    core: str = "mlp"  # one of networks.CORES: "mlp", "gru", "lstm"
    hidden_size: int = 64  # the recurrent core's size (gru, lstm; the mlp refuses another)
    policy_hidden: tuple[int, ...] = (64, 64)
    value_hidden: tuple[int, ...] = (64, 64)
    action_distribution: str = "tanh_normal"  # "tanh_normal" (continuous) or "categorical"
    rl2_inputs: bool = False  # feed previous action, reward and a new-episode flag
    reset_every_episode: bool = False  # reset recurrent state every episode, not every trial
    # "trial": RL^2 returns run across a trial's episodes; "episode": each its own
    returns_span: str = "trial"
    # reset_strategy "stock" ("auto" on a GPU): stock_depth fresh states stocked per env.
    # Deeper than unroll_length, it is refilled before a rollout only where some env
    # could run short, in whole chunks (`metarl.envs.refill_stocks`); shallower, it must
    # divide unroll_length and is refilled before every stock_depth steps. None:
    # 2 * unroll_length, or where that stock would not fit the device's memory budget
    # (`training.STOCK_MEMORY_SHARE`) the largest divisor of unroll_length that fits.
    stock_depth: int | None = None
    seed: int = 0  # the run's seed (jax.random.key), 0 <= seed < 2**32

    def __post_init__(self):
        self._check_types()
        check_seeds(self.seed, 1, "PPOConfig.seed")
        for name in (*_POSITIVE_INTS, "hidden_size"):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"PPOConfig.{name} must be an integer >= 1, got {getattr(self, name)!r}"
                )
        if self.num_envs % self.num_minibatches:
            raise ValueError(
                f"num_envs ({self.num_envs}) must be divisible by num_minibatches "
                f"({self.num_minibatches}): minibatches split the envs"
            )
        if self.stock_depth is not None and (
            self.stock_depth < 1
            or (self.stock_depth < self.unroll_length and self.unroll_length % self.stock_depth)
        ):
            raise ValueError(
                f"PPOConfig.stock_depth must be None, at least unroll_length "
                f"({self.unroll_length}), or a divisor of it (one of "
                f"{divisors(self.unroll_length)}), got {self.stock_depth!r}"
            )
        if self.core not in CORES:
            raise ValueError(f"PPOConfig.core must be one of {sorted(CORES)}, got {self.core!r}")
        default_hidden = type(self).__dataclass_fields__["hidden_size"].default
        if self.core == "mlp" and self.hidden_size != default_hidden:
            raise ValueError(
                f"PPOConfig.hidden_size={self.hidden_size} sizes a recurrent core ('gru', "
                "'lstm'); core='mlp' has none, so it would change nothing. The mlp's layers "
                "are policy_hidden and value_hidden: leave hidden_size out, or choose a "
                "recurrent core"
            )
        if self.reset_every_episode and self.core == "mlp" and not self.rl2_inputs:
            raise ValueError(
                "PPOConfig.reset_every_episode=True has nothing to reset: the mlp core keeps no "
                "state and rl2_inputs is False. Use core='gru' or 'lstm', or rl2_inputs=True, "
                "or leave it False"
            )
        if self.action_distribution not in ACTION_DISTRIBUTIONS:
            raise ValueError(
                f"PPOConfig.action_distribution must be one of {sorted(ACTION_DISTRIBUTIONS)}, "
                f"got {self.action_distribution!r}"
            )
        if self.returns_span not in RETURNS_SPANS:
            raise ValueError(
                f"PPOConfig.returns_span must be one of {RETURNS_SPANS}, got {self.returns_span!r}"
            )
        if not 0 < self.discounting <= 1 or not 0 <= self.gae_lambda <= 1:
            raise ValueError(
                f"need 0 < discounting <= 1 and 0 <= gae_lambda <= 1, got {self.discounting}, "
                f"{self.gae_lambda}"
            )
        if not 0 < self.clipping_epsilon < 1:
            raise ValueError(
                "PPOConfig.clipping_epsilon must be in (0, 1): the ratio is clipped to "
                f"[1 - eps, 1 + eps], got {self.clipping_epsilon!r}"
            )
        for name in ("learning_rate", "reward_scaling"):
            if getattr(self, name) <= 0:
                raise ValueError(f"PPOConfig.{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("entropy_cost", "value_loss_coef"):
            if getattr(self, name) < 0:
                raise ValueError(f"PPOConfig.{name} must be >= 0, got {getattr(self, name)!r}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(
                f"PPOConfig.max_grad_norm must be > 0 or None, got {self.max_grad_norm!r}"
            )

    def _check_types(self) -> None:
        """Checks each field's type and stores NumPy scalars as Python ints and floats and
        a list of layer sizes as a tuple, so equal configs compare and hash equal."""
        for name in (*_POSITIVE_INTS, "hidden_size", "seed"):
            if not _is_int(getattr(self, name)):
                raise TypeError(f"PPOConfig.{name} must be an int, got {getattr(self, name)!r}")
            self._set(name, int(getattr(self, name)))
        if self.stock_depth is not None:
            if not _is_int(self.stock_depth):
                raise TypeError(
                    f"PPOConfig.stock_depth must be an int or None, got {self.stock_depth!r}"
                )
            self._set("stock_depth", int(self.stock_depth))
        for name in _BOOLS:
            if not isinstance(getattr(self, name), bool):
                raise TypeError(
                    f"PPOConfig.{name} must be True or False, got {getattr(self, name)!r}"
                )
        floats = _FLOATS + (() if self.max_grad_norm is None else ("max_grad_norm",))
        for name in floats:
            value = getattr(self, name)
            if not _is_number(value):
                raise TypeError(f"PPOConfig.{name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"PPOConfig.{name} must be finite, got {value!r}")
            self._set(name, float(value))
        for name in ("policy_hidden", "value_hidden"):
            sizes = getattr(self, name)
            if not isinstance(sizes, tuple | list) or not all(_is_int(s) for s in sizes):
                raise TypeError(
                    f"PPOConfig.{name} must be a tuple of layer sizes, e.g. (64, 64), got {sizes!r}"
                )
            if any(s < 1 for s in sizes):
                raise ValueError(f"PPOConfig.{name}: every layer size must be >= 1, got {sizes!r}")
            self._set(name, tuple(int(s) for s in sizes))
        for name in ("core", "action_distribution", "returns_span"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"PPOConfig.{name} must be a string, got {getattr(self, name)!r}")

    def _set(self, name: str, value) -> None:
        object.__setattr__(self, name, value)  # frozen: only __post_init__ normalises

    @property
    def batch_size(self) -> int:
        """Env steps per iteration."""
        return self.num_envs * self.unroll_length
