"""`MjcfEnv`: a user's own MJCF robot as a metarl env, simulated by MuJoCo-MJX.

Give the model (an MJCF path, an XML string, a `mujoco.MjModel` or an
`mjx.Model`) and two functions, or subclass and override the methods:

```python
def observe(data, task):            # mjx.Data -> float[obs_size]
    return jnp.concatenate([data.qpos, data.qvel])

def reward(data, action, next_data, task):   # -> float[]
    return next_data.qpos[0] - data.qpos[0]

env = MjcfEnv("robot.xml", observe=observe, reward=reward, n_frames=5)
contextual = make_contextual(env, C.ContextSpace({"mass[torso]": C.Scale(0.5, 2.0)}))
```

`task` is the env's ``task_params`` with any task context drawn in. The
control step is ``n_frames`` physics steps of the *current* timestep, so
``timestep`` is a safe context here. `MjcfEnv` is itself a metarl env source
(see `metarl.envs.sources`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import numbers
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import mujoco
from brax.envs.base import State
from mujoco import mjx

from metarl.envs.sources import _swapped, observation_size_of

Observe = Callable[[mjx.Data, Mapping[str, jax.Array]], jax.Array]
Reward = Callable[[mjx.Data, jax.Array, mjx.Data, Mapping[str, jax.Array]], jax.Array]
Terminated = Callable[[mjx.Data, Mapping[str, jax.Array]], jax.Array]


def _load(model: Any) -> mjx.Model:
    if isinstance(model, mjx.Model):
        return model
    if isinstance(model, mujoco.MjModel):
        return mjx.put_model(model)
    if isinstance(model, str | os.PathLike):
        text = str(model)
        if text.lstrip().startswith("<"):
            return mjx.put_model(mujoco.MjModel.from_xml_string(text))
        if not os.path.exists(text):
            raise ValueError(f"MjcfEnv: no MJCF file at {text!r}")
        return mjx.put_model(mujoco.MjModel.from_xml_path(text))
    raise ValueError(
        "MjcfEnv: model must be an MJCF path, an XML string, a mujoco.MjModel or an mjx.Model; "
        f"got {type(model).__name__}"
    )


class MjcfEnv:
    """A MuJoCo model plus observation, reward and (optional) termination functions."""

    backend = "mjx"
    stale: Mapping[str, str] = {}
    task_params: Mapping[str, Any] = {}

    def __init__(
        self,
        model: Any,
        *,
        observe: Observe | None = None,
        reward: Reward | None = None,
        terminated: Terminated | None = None,
        n_frames: int = 1,
        reset_noise: float = 0.01,
        task_params: Mapping[str, Any] | None = None,
    ):
        self._mjx_model = _load(model)
        for name, fn in (("observe", observe), ("reward", reward), ("terminated", terminated)):
            if fn is not None and not callable(fn):
                raise ValueError(f"MjcfEnv: {name} must be a function, got {type(fn).__name__}")
            if fn is not None:
                _check_arguments(name, fn)
        for name, fn in (("observe", observe), ("reward", reward)):
            overridden = getattr(type(self), name) is not getattr(MjcfEnv, name)
            if fn is None and not overridden:
                raise ValueError(f"MjcfEnv needs {name}=... (a function) or a subclass defining it")
        self._observe, self._reward, self._terminated = observe, reward, terminated
        if not isinstance(n_frames, numbers.Integral) or isinstance(n_frames, bool) or n_frames < 1:
            raise ValueError(f"n_frames must be an integer >= 1, got {n_frames!r}")
        if not (
            isinstance(reset_noise, numbers.Real)
            and not isinstance(reset_noise, bool)  # True read as 1.0: noise as wide as pi/3
            and 0 <= reset_noise < math.inf
        ):
            raise ValueError(f"reset_noise must be a finite number >= 0, got {reset_noise!r}")
        self.n_frames = int(n_frames)
        self.reset_noise = float(reset_noise)
        if task_params is not None:
            if not isinstance(task_params, Mapping):
                raise ValueError(
                    "task_params must be a mapping {name: default value}, got "
                    f"{type(task_params).__name__}"
                )
            self.task_params = dict(task_params)

    # ---- the functions a user gives or overrides ----
    def observe(self, data: mjx.Data, task: Mapping[str, jax.Array]) -> jax.Array:
        return self._observe(data, task)

    def reward(self, data, action, next_data, task) -> jax.Array:
        return self._reward(data, action, next_data, task)

    def terminated(self, data: mjx.Data, task: Mapping[str, jax.Array]) -> jax.Array:
        return jnp.zeros(()) if self._terminated is None else self._terminated(data, task)

    # ---- the source interface ----
    @property
    def env(self) -> MjcfEnv:
        return self

    @property
    def model(self) -> mjx.Model:
        return self._mjx_model

    @property
    def action_size(self) -> int:
        return int(self._mjx_model.nu)

    @functools.cached_property
    def observation_size(self) -> int:  # each reading traced the reset (check_env read it twice)
        return observation_size_of(self.reset)

    def using(self, model, task) -> contextlib.AbstractContextManager:
        return _swapped(self, _mjx_model=model, task_params=task)

    def reset(self, key_data: jax.Array) -> State:
        m = self._mjx_model
        k_q, k_v = jax.random.split(key_data)
        qpos = m.qpos0 + self.reset_noise * jax.random.uniform(k_q, (m.nq,), minval=-1, maxval=1)
        qvel = self.reset_noise * jax.random.uniform(k_v, (m.nv,), minval=-1, maxval=1)
        data = mjx.forward(m, mjx.make_data(m).replace(qpos=qpos, qvel=qvel))
        zero = jnp.zeros((), jnp.float32)
        obs = _shaped("observe", self.observe(data, self.task_params), "a 1-D vector", 1)
        return State(data, obs, zero, zero, {}, {})

    def step(self, state: State, action: jax.Array) -> State:
        m = self._mjx_model
        data = state.pipeline_state.replace(ctrl=action)
        data = jax.lax.fori_loop(0, self.n_frames, lambda _, d: mjx.step(m, d), data)
        task = self.task_params
        reward = _shaped("reward", self.reward(state.pipeline_state, action, data, task))
        done = _shaped("terminated", self.terminated(data, task))
        obs = _shaped("observe", self.observe(data, task), "a 1-D vector", 1)
        return state.replace(pipeline_state=data, obs=obs, reward=reward, done=done)


# The arguments each function is called with (a signature that cannot take them failed
# at the first trace with a TypeError naming a lambda, not which function)
_ARGUMENTS = {
    "observe": ("data", "task"),
    "reward": ("data", "action", "next_data", "task"),
    "terminated": ("data", "task"),
}


def _check_arguments(name: str, fn: Callable) -> None:
    args = _ARGUMENTS[name]
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C function: nothing to check
        return
    try:
        signature.bind(*args)
    except TypeError as e:
        raise ValueError(
            f"MjcfEnv: {name} is called as {name}({', '.join(args)}); its signature "
            f"{signature} cannot take that ({e})"
        ) from None


def _shaped(name: str, value: Any, what: str = "one number (shape ())", ndim: int = 0):
    """`value` as float32, refused (at trace time) unless it has `ndim` dimensions: a
    reward of shape (3,) made every env's return a vector, a 2-D observation reported
    its last axis as the observation size."""
    try:
        value = jnp.asarray(value, jnp.float32)
    except (TypeError, ValueError):  # None, a dict: "None is not a valid value for jnp.array"
        raise ValueError(
            f"MjcfEnv: {name} must return {what} for one env, got a {type(value).__name__}"
        ) from None
    if value.ndim != ndim:
        raise ValueError(
            f"MjcfEnv: {name} must return {what} for one env, got shape {value.shape} "
            "(metarl batches envs with vmap: return one env's value)"
        )
    return value
