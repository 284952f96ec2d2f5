"""Env sources: what `ContextualEnv` needs from the env it wraps, for each kind of env.

A source exposes the default physics model (a Brax `System` or an
`mjx.Model`), its backend, the env's task parameters, and `reset` / `step`
returning a Brax `State`; `using(model, task)` runs the env on another model
and task, traced values included. Three sources:

* `BraxSource`: a Brax `PipelineEnv` (its System is swapped in `env.sys`).
* `PlaygroundSource`: a MuJoCo Playground `MjxEnv` (its `_mjx_model` is
  swapped; Playground's `State` is converted to Brax's, `data` becoming
  `pipeline_state`).
* `metarl.envs.MjcfEnv`: a user's own MJCF, which is a source itself.

An env may declare task parameters as ``task_params = {name: default}`` and read
``self.task_params[name]`` in its reset and step; metarl swaps in the drawn
values, so a goal becomes a context like any other.
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import jax
import numpy as np
from brax.envs.base import PipelineEnv, State

from metarl.contexts import LogUniform
from metarl.contexts.space import MOCAP_POSE

PLAYGROUND_PREFIX = "playground/"

# Model constants Playground envs read into Python at construction: varying them
# would reach the simulator but not the env's own cached copies.
PLAYGROUND_STALE = {
    "timestep": "Playground envs fix their control step (n_substeps = ctrl_dt / sim_dt) at "
    "construction, so a new timestep would silently change the control rate; set ctrl_dt and "
    "sim_dt in the env's config instead",
    "opt.timestep": "see 'timestep': the env's n_substeps is fixed at construction",
    "geom_size": "Playground envs read geom sizes into Python constants at construction (the "
    "reacher's target radius, foot sizes), so their rewards would not follow a new size",
    "geom_rbound": "geom bounding radii follow 'geom_size', which Playground envs cache",
    "jnt_range": "Playground envs read joint ranges at construction (reset sampling, limits in "
    "rewards and observations)",
    "actuator_ctrlrange": "Playground envs read control ranges at construction (action scaling)",
    "jnt_actfrcrange": "Playground envs read joint actuator force ranges at construction "
    "(Apollo's torque limits, which its reward divides torques by)",
    # What MJX's make_data copies from the model. A Playground reset makes its data from
    # the host MjModel it was built with (mjx_env.make_data), never from the model metarl
    # swaps in: a context here reached only the inverse weights metarl derives at qpos0
    # (BallInCup and HumanoidStand reset at the host's qpos0; FingerSpin's target stayed
    # at the host's mocap pose).
    "qpos0": "Playground envs make each reset's data from the MjModel they were built with "
    "(or draw the pose themselves), so a new qpos0 would never reach the reset pose",
    "eq_active0": "Playground envs make each reset's data from the MjModel they were built "
    "with, so a new eq_active0 would never reach the reset",
    MOCAP_POSE: "whose pose a Playground reset copies from the MjModel it was built with "
    "(then sets itself, as the reacher's target), never from the model metarl swaps in",
}


class Source(Protocol):
    """What `ContextualEnv` needs from the env it wraps."""

    env: Any  # the env as the user gave it (`ContextualEnv.unwrapped`)
    stale: Mapping[str, str]  # context names / raw fields refused, with the reason

    @property
    def model(self) -> Any: ...  # the default System or mjx.Model
    @property
    def backend(self) -> str: ...
    @property
    def task_params(self) -> Mapping[str, Any]: ...
    @property
    def observation_size(self) -> int: ...
    @property
    def action_size(self) -> int: ...
    def using(self, model: Any, task: Mapping[str, Any]) -> contextlib.AbstractContextManager: ...
    def reset(self, key_data: jax.Array) -> State: ...
    def step(self, state: State, action: jax.Array) -> State: ...


@contextlib.contextmanager
def _swapped(obj: Any, **attrs: Any) -> Iterator[None]:
    """Temporarily sets attributes of `obj` (traced values are fine); an attribute
    that was not there is removed again."""
    missing = object()
    old = {k: obj.__dict__.get(k, missing) for k in attrs}
    for k, v in attrs.items():
        setattr(obj, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is missing:
                delattr(obj, k)
            else:
                setattr(obj, k, v)


def observation_size_of(reset: Callable[[jax.Array], State]) -> int | Any:
    """An env's `observation_size` from the shapes its `reset` returns, found by
    `jax.eval_shape` (tracing only). Brax's own property runs `reset` op by op,
    which compiles every operation on its first use in a process: 17.6 s on hopper
    (2 CPU cores) against half a second here. A dict observation gives its
    shapes, as in Brax."""
    # a raw key, as Brax resets take, of the PRNG implementation in use (threefry: 2 words)
    key = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0)))
    obs = jax.eval_shape(reset, key).obs
    if isinstance(obs, jax.ShapeDtypeStruct):
        return obs.shape[-1]
    return jax.tree.map(lambda x: x.shape, obs)


def _task(env: Any) -> dict[str, Any]:
    task = getattr(env, "task_params", None) or {}
    if not isinstance(task, Mapping):
        raise ValueError(
            f"{type(env).__name__}.task_params must be a mapping {{name: default value}}, got "
            f"{type(task).__name__}"
        )
    return dict(task)


def check_task(env: Any, task: Mapping[str, Any]) -> dict[str, float]:
    """The env's task parameters checked (each default a number or an array of
    numbers) and its ``task_periods`` checked against them: {name: period} of its
    periodic ones, each a declared float parameter with a finite period > 0."""
    who = type(env).__name__
    for name, default in task.items():
        if np.asarray(default).dtype.kind not in "biuf":
            raise ValueError(
                f"{who}.task_params[{name!r}] must be a number or an array of numbers (the "
                f"default its reset and step read), got {default!r}"
            )
    periods = getattr(env, "task_periods", None) or {}
    if not isinstance(periods, Mapping):
        raise ValueError(
            f"{who}.task_periods must be a mapping {{task parameter: period}}, got "
            f"{type(periods).__name__}"
        )
    checked = {}
    for name, period in periods.items():
        if name not in task:
            raise ValueError(
                f"{who}.task_periods names {name!r}, which is not one of its task parameters: "
                f"{', '.join(map(repr, task)) or 'it declares none'}"
            )
        if (
            isinstance(period, bool)
            or not isinstance(period, numbers.Real)
            or not math.isfinite(period)
            or period <= 0
        ):
            raise ValueError(
                f"{who}.task_periods[{name!r}] must be a finite number > 0 (2 pi for an angle "
                f"in radians), got {period!r}"
            )
        if np.asarray(task[name]).dtype.kind != "f":
            raise ValueError(
                f"{who}.task_periods[{name!r}]: the env declares it as "
                f"{np.asarray(task[name]).dtype} ({task[name]!r}), and a periodic task "
                "parameter is a float"
            )
        checked[name] = float(period)
    return checked


def check_periodic(periods: Mapping[str, float], space: Any, what: str) -> None:
    """Refuses a relative or log-uniform range of a periodic task parameter in
    `space`: held-out evaluation measures a turn in the parameter's own units."""
    for name, period in periods.items():
        dist = space[name] if name in space else None
        if dist is not None and (dist.relative or isinstance(dist, LogUniform)):
            kind = "a relative scale" if dist.relative else "a LogUniform"
            raise ValueError(
                f"{what}: context {name!r} is periodic (task_periods: {period:g}), so it takes "
                "absolute values in its period's units (Uniform, Normal, TruncatedNormal, "
                f"Choice or Fixed), not {kind}: held-out evaluation measures the turn in those "
                "units"
            )


class BraxSource:
    """A Brax `PipelineEnv`."""

    stale: Mapping[str, str] = {}

    def __init__(self, env: PipelineEnv):
        self.env = env
        self._task = _task(env)

    model = property(lambda self: self.env.sys)
    backend = property(lambda self: self.env.backend)
    task_params = property(lambda self: self._task)
    action_size = property(lambda self: self.env.action_size)

    @functools.cached_property
    def observation_size(self):
        return observation_size_of(self.env.reset)

    def using(self, model, task):
        return _swapped(self.env, sys=model, task_params=task)

    def reset(self, key_data):
        return self.env.reset(key_data)

    def step(self, state, action):
        if self.backend in ("positional", "spring"):
            # These pipelines keep each link's mass in their state from its init (the
            # reset) and step with that copy: read it from the System this step runs,
            # as every other field is (the same expression as their init). Else a mass
            # reaches a spring walker2d only through its reset (spring_inertia_scale 1
            # drops the inertia that mass scales), and a step from a state of another
            # context would simulate that context's masses.
            sys, ps = self.env.sys, state.pipeline_state
            mass = sys.link.inertia.mass ** (1 - sys.spring_mass_scale)
            state = state.replace(pipeline_state=ps.replace(mass=mass))
        return self.env.step(state, action)


class PlaygroundSource:
    """A MuJoCo Playground env (`mujoco_playground.MjxEnv`) with a flat observation."""

    stale: Mapping[str, str] = PLAYGROUND_STALE
    backend = "mjx"

    def __init__(self, env: Any):
        from mujoco_playground import State as PlaygroundState  # optional extra

        self._state_type = PlaygroundState
        if env.unwrapped is not env:  # the swapped model would not reach the inner env
            raise ValueError(
                f"{type(env).__name__} wraps the Playground env "
                f"{type(env.unwrapped).__name__}: metarl writes each context into the model of "
                "the env it is given, which the wrapped env, simulating its own model, would "
                "never read. Pass the Playground env itself, before any wrapper (metarl "
                "handles episodes, resets and batching itself)"
            )
        self.env = env
        self._task = _task(env)
        self.stale = {**PLAYGROUND_STALE, **_cached_masses(env)}
        repeat = getattr(getattr(env, "_config", None), "action_repeat", 1)
        if repeat != 1:  # read by Playground's Brax training wrapper, not by the env
            raise ValueError(
                f"{type(env).__name__} has action_repeat={repeat}, which only Playground's "
                "Brax training wrapper reads: metarl steps the env itself, once per action, so "
                "it would be ignored. Lengthen the control step in the env's config instead "
                "(ctrl_dt, a multiple of sim_dt)"
            )
        ctrl, sim = (getattr(env, a, None) for a in ("dt", "sim_dt"))
        if ctrl is not None and sim is not None:
            # Playground steps round(ctrl_dt / sim_dt) physics steps per action: any other
            # ratio silently changes the control step (0 steps: the physics never moves)
            ctrl, sim = float(ctrl), float(sim)
            n = round(ctrl / sim)
            if n < 1 or abs(n * sim - ctrl) > 1e-6 * ctrl:
                raise ValueError(
                    f"{type(env).__name__} has ctrl_dt={ctrl:g} and sim_dt={sim:g}: Playground "
                    f"steps round(ctrl_dt / sim_dt) = {n} physics steps of sim_dt per action, "
                    f"{n * sim:g} s, not ctrl_dt. Choose a ctrl_dt that is a whole multiple (at "
                    "least 1) of sim_dt"
                )
        size = self._observation_size = env.observation_size  # Playground's traces its reset
        if not isinstance(size, int):
            raise ValueError(
                f"{type(env).__name__} observes a dict {dict(size)}; metarl's agents take one "
                "flat observation vector: wrap the env so that its obs is an array"
            )

    model = property(lambda self: self.env.mjx_model)
    task_params = property(lambda self: self._task)
    observation_size = property(lambda self: self._observation_size)
    action_size = property(lambda self: self.env.action_size)

    def using(self, model, task):
        return _swapped(self.env, _mjx_model=model, task_params=task)

    def reset(self, key_data):
        return _to_brax(self.env.reset(key_data))

    def step(self, state, action):
        s = self._state_type(
            state.pipeline_state, state.obs, state.reward, state.done, state.metrics, state.info
        )
        return _to_brax(self.env.step(s, action))


def _cached_masses(env: Any) -> dict[str, str]:
    """`mass` and the raw mass fields, refused where the env keeps a mass of its own
    (Go1's, Spot's, OP3's, Barkour's torso, the LEAP hand's cube: `_torso_mass`,
    `_cube_mass`, read from the model at construction and scaling its pushes)."""
    cached = sorted(k for k in vars(env) if k.endswith("_mass"))
    if not cached:
        return {}
    why = (
        f"{type(env).__name__} reads {', '.join(cached)} from the model at construction (to "
        "scale the pushes it applies, say), which a new mass would leave stale"
    )
    return dict.fromkeys(("mass", "body_mass", "body_subtreemass"), why)


def _to_brax(s) -> State:
    return State(s.data, s.obs, s.reward, s.done, dict(s.metrics), dict(s.info))


def is_playground_env(env: Any) -> bool:
    """True for an instance of Playground's `MjxEnv` (without importing Playground)."""
    return any(
        c.__name__ == "MjxEnv" and c.__module__.startswith("mujoco_playground")
        for c in type(env).__mro__
    )


def load_playground(name: str, config_overrides: Mapping[str, Any]) -> Any:
    """A Playground env by registry name, with MJX's JAX implementation unless overridden."""
    try:
        from mujoco_playground import registry
    except ImportError as e:
        raise ValueError(
            f"{PLAYGROUND_PREFIX}{name} needs MuJoCo Playground: pip install -e '.[playground]' "
            f"({e})"
        ) from None
    if name not in registry.ALL_ENVS:
        raise ValueError(
            f"unknown Playground env {name!r}; valid names: {', '.join(sorted(registry.ALL_ENVS))}"
        )
    return registry.load(name, config_overrides={"impl": "jax", **dict(config_overrides)})
