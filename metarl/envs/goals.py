"""Task contexts: envs whose goal is a context, like CARL's target distance and
direction.

An env declares ``task_params = {name: default}`` (and, for an angle,
``task_periods = {name: period}``) and reads
``self.task_params[name]`` wherever its task needs it; metarl swaps in the drawn
values inside jit (see `metarl.envs.sources`), so a goal is drawn per episode
or per trial, stored in ``state.info["context"]`` and moved by curricula like
any physics quantity.

`ReacherGoal` (registered as the Brax env ``"reacher_goal"``): Brax's reacher,
whose target is no longer random but sits at ``goal_distance`` metres from the
arm's base in direction ``goal_direction`` (radians). The reward is Brax's
(minus the fingertip's distance to the target, minus a control cost), so the
goal decides what is rewarded. The Playground version lives in
`metarl.envs.playground_tasks` (optional extra).
"""

import math

import jax
import jax.numpy as jnp
from brax import envs as brax_envs
from brax.envs.reacher import Reacher

GOAL_DEFAULTS = {"goal_distance": 0.15, "goal_direction": 0.0}
# An angle: held-out evaluation takes it outside its range modulo a turn
# (`metarl.evaluation.extrapolation`).
GOAL_PERIODS = {"goal_direction": 2 * math.pi}


def goal_xy(task) -> jax.Array:
    """The goal's (x, y) in the plane from its distance and direction."""
    d, a = task["goal_distance"], task["goal_direction"]
    return jnp.stack([d * jnp.cos(a), d * jnp.sin(a)])


class ReacherGoal(Reacher):
    """Brax's reacher with its target set by the task contexts (see module docstring)."""

    task_params = GOAL_DEFAULTS
    task_periods = GOAL_PERIODS

    def _random_target(self, rng: jax.Array) -> tuple[jax.Array, jax.Array]:
        return rng, goal_xy(self.task_params)


brax_envs.register_environment("reacher_goal", ReacherGoal)
