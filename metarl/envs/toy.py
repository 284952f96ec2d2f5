"""A tiny contact env: a ball on a floor, pushed along x (registered as "puck").

Slide joints x and z, a hinge for rolling, one motor on x: it compiles in
seconds on every backend, yet has gravity, mass, inertia, contact friction,
restitution, geom size, joint damping / armature / stiffness and an actuator.
The reward is the ball's x velocity, so hiding the motor's sign
(`actuator_gain` drawn from `Choice([-1, 1], relative=True)`) makes a task
that only an agent with memory can solve: push, see which way the ball went,
then keep pushing that way. It doubles as a template for wrapping your own
MJCF model as a Brax `PipelineEnv`.
"""

import jax
import jax.numpy as jnp
from brax import envs as brax_envs
from brax.envs.base import PipelineEnv, State
from brax.io import mjcf

XML = """
<mujoco model="puck">
  <option timestep="0.01"/>
  <worldbody>
    <geom name="floor" type="plane" size="10 10 0.1" friction="0.5 0.1 0.1"/>
    <body name="ball" pos="0 0 0.3">
      <joint name="x" type="slide" axis="1 0 0" damping="0.2" armature="0.01"/>
      <joint name="z" type="slide" axis="0 0 1"/>
      <joint name="spin" type="hinge" axis="0 1 0" damping="0.01"/>
      <geom name="ball" type="sphere" size="0.1" mass="1" friction="0.5 0.1 0.1"/>
    </body>
  </worldbody>
  <actuator>
    <motor joint="x" gear="10" ctrlrange="-1 1"/>
  </actuator>
</mujoco>
"""


class Puck(PipelineEnv):
    """obs = (q, qd), or q alone with ``velocity_in_obs=False``; reward = x velocity;
    never terminates. Without velocities a feed-forward policy cannot tell which
    way its push moved the ball; an agent that sees its previous action and
    reward (RL^2) can."""

    def __init__(self, backend: str = "generalized", velocity_in_obs: bool = True, **kwargs):
        self._velocity_in_obs = velocity_in_obs
        sys = mjcf.loads(XML)
        super().__init__(sys=sys, backend=backend, n_frames=kwargs.pop("n_frames", 2), **kwargs)

    def reset(self, rng: jax.Array) -> State:
        q = self.sys.init_q + jax.random.uniform(
            rng, (self.sys.q_size(),), minval=-0.01, maxval=0.01
        )
        qd = jnp.zeros(self.sys.qd_size())
        ps = self.pipeline_init(q, qd)
        zero = jnp.zeros(())
        return State(ps, self._obs(ps), zero, zero, {}, {})

    def step(self, state: State, action: jax.Array) -> State:
        ps = self.pipeline_step(state.pipeline_state, action)
        return state.replace(
            pipeline_state=ps, obs=self._obs(ps), reward=ps.qd[0], done=jnp.zeros(())
        )

    def _obs(self, ps):
        return jnp.concatenate([ps.q, ps.qd]) if self._velocity_in_obs else ps.q


brax_envs.register_environment("puck", Puck)
