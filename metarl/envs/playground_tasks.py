"""MuJoCo Playground envs with task contexts (needs ``pip install -e ".[playground]"``).

`PlaygroundReacherGoal`: Playground's dm_control-suite reacher whose target is
set by the task contexts ``goal_distance`` and ``goal_direction`` (see
`metarl.envs.goals`) instead of a random draw. Playground's reward
(fingertip within the target's radius) then depends on the goal.
"""

from __future__ import annotations

import jax
from mujoco import mjx
from mujoco_playground._src.dm_control_suite import reacher

from metarl.envs.goals import GOAL_DEFAULTS, GOAL_PERIODS, goal_xy


class PlaygroundReacherGoal(reacher.Reacher):
    """Playground's reacher (big target, as "ReacherEasy") with a goal context."""

    task_params = GOAL_DEFAULTS
    task_periods = GOAL_PERIODS

    def __init__(self, target_size: float = reacher.BIG_TARGET, **config_overrides):
        config = reacher.default_config()
        super().__init__(target_size, config, {"impl": "jax", **config_overrides})

    def reset(self, rng: jax.Array):
        state = super().reset(rng)
        target = self.mj_model.body("target").mocapid[0]
        data = state.data.replace(
            mocap_pos=state.data.mocap_pos.at[target, :2].set(goal_xy(self.task_params))
        )
        data = mjx.forward(self.mjx_model, data)
        return state.replace(data=data, obs=self._get_obs(data, state.info))
