"""Bad inputs, one row each: every one gets a clear TypeError or ValueError naming the
problem, raised before anything compiles."""

import functools
import math
import types

import jax
import mujoco
import numpy as np
import pytest
from mujoco import mjx

import curricula
from metarl import checkpoint, experiment
from metarl import contexts as C
from metarl import evaluation as E
from metarl.agents import ppo
from metarl.envs import check_env, make_contextual
from metarl.envs.toy import Puck
from metarl.tensorboard import RunLogger

G = C.ContextSpace({"gravity": C.Uniform(5.0, 15.0)})
IMPLICITFAST = """<mujoco><option integrator="implicitfast"/><worldbody>
<body><freejoint/><geom size="0.1" mass="1"/></body></worldbody></mujoco>"""
SMALL = {"num_envs": 8, "num_minibatches": 2, "unroll_length": 4}


@functools.cache
def env():
    return make_contextual(Puck(), G, episode_length=20)


@functools.cache
def space(**overrides):
    return ppo.make_train_space(env(), ppo.PPOConfig(**{**SMALL, **overrides}))


@functools.cache
def states():
    s = space()
    return ppo.init_training_state(s, jax.random.key(0)), ppo.init_env_state(s, jax.random.key(1))


def config(**kw):
    return lambda: ppo.PPOConfig(**kw)


def run_train(num_steps=64, **kw):
    def go():
        ts, es = states()
        return ppo.run_train(
            kw.pop("space", space()), kw.pop("ts", ts), kw.pop("es", es), num_steps, **kw
        )

    return go


def other_size_state():
    other = ppo.make_train_space(env(), ppo.PPOConfig(**{**SMALL, "num_envs": 16}))
    return ppo.init_env_state(other, jax.random.key(2))


def other_config_state():
    other = ppo.make_train_space(env(), ppo.PPOConfig(**SMALL, policy_hidden=(8,)))
    return ppo.init_training_state(other, jax.random.key(2))


def swapped_ranges():
    """G's bounds swapped (15, 5) by rebuilding the tree: no Uniform.__init__ runs."""
    return jax.tree.unflatten(jax.tree.structure(G), jax.tree.leaves(G)[::-1])


def bind(spec, name="inverted_pendulum", **kw):
    return lambda: make_contextual(name, C.ContextSpace(spec), **kw)


FLOATS = [
    "learning_rate",
    "entropy_cost",
    "discounting",
    "gae_lambda",
    "clipping_epsilon",
    "max_grad_norm",
    "value_loss_coef",
    "reward_scaling",
]
INTS = ["num_envs", "unroll_length", "num_minibatches", "num_updates_per_batch", "hidden_size"]

ROWS = [
    # -- PPOConfig: types and finiteness of every field --
    *[(f"{f}=nan", config(**{f: math.nan}), ValueError, f"{f} must be finite") for f in FLOATS],
    *[(f"{f}=inf", config(**{f: math.inf}), ValueError, f"{f} must be finite") for f in FLOATS],
    *[(f"{f}=str", config(**{f: "3e-4"}), TypeError, f"{f} must be a number") for f in FLOATS],
    *[(f"{f}=0", config(**{f: 0}), ValueError, f"{f} must be an integer >= 1") for f in INTS],
    *[(f"{f}=-3", config(**{f: -3}), ValueError, f"{f} must be an integer >= 1") for f in INTS],
    *[(f"{f}=2.5", config(**{f: 2.5}), TypeError, f"{f} must be an int") for f in INTS],
    *[(f"{f}=str", config(**{f: "8"}), TypeError, f"{f} must be an int") for f in INTS],
    *[
        (f"{f}={v!r}", config(**{f: v}), TypeError, f"{f} must be True or False")
        for f in ("normalize_observations", "rl2_inputs", "reset_every_episode")
        for v in ("yes", 1)
    ],
    *[
        (
            f"stock_depth={v}",
            config(unroll_length=8, stock_depth=v),
            ValueError,
            "stock_depth must be None, at least unroll_length (8), or a divisor of it (one "
            "of [1, 2, 4, 8])",
        )
        for v in (3, 0, 6)
    ],
    ("stock_depth=2.0", config(stock_depth=2.0), TypeError, "stock_depth must be an int or None"),
    ("seed=abc", config(seed="abc"), TypeError, "seed must be an int"),
    ("seed=1.5", config(seed=1.5), TypeError, "seed must be an int"),
    # jax.random.key keeps 32 bits: seed 2**32 would be seed 0's run, -1 seed 2**32 - 1's
    ("seed=-1", config(seed=-1), ValueError, "seed -1 outside 0..4294967295"),
    ("seed=2**32", config(seed=2**32), ValueError, "seed 4294967296 outside"),
    (
        "seed_keys past 2**32",
        lambda: ppo.seed_keys(2**32 - 1, 2),
        ValueError,
        "seeds 4294967295..4294967296 outside",
    ),
    (
        "run seeds past 2**32",
        lambda: experiment.run(
            None, logdir="/tmp/x", segments=1, steps_per_segment=1, seed=2**32 - 1, num_seeds=3
        ),
        ValueError,
        "would repeat another one's run",
    ),
    (
        "run num_seeds 0",
        lambda: experiment.run(
            None, logdir="/tmp/x", segments=1, steps_per_segment=1, seed=0, num_seeds=0
        ),
        ValueError,
        "num_seeds must be an integer >= 1",
    ),
    *[
        (f"{f}={v!r}", config(**{f: v}), err, msg)
        for f in ("policy_hidden", "value_hidden")
        for v, err, msg in (
            (64, TypeError, "tuple of layer sizes"),
            ((0,), ValueError, "every layer size must be >= 1"),
            ((-4,), ValueError, "every layer size must be >= 1"),
            (("a",), TypeError, "tuple of layer sizes"),
        )
    ],
    ("core=rnn", config(core="rnn"), ValueError, "core must be one of"),
    ("core=None", config(core=None), TypeError, "core must be a string"),
    ("distribution", config(action_distribution="gaussian"), ValueError, "must be one of"),
    ("returns_span", config(returns_span="forever"), ValueError, "returns_span must be one of"),
    ("indivisible", config(num_envs=10, num_minibatches=4), ValueError, "divisible"),
    ("discounting=0", config(discounting=0.0), ValueError, "0 < discounting <= 1"),
    ("discounting=1.5", config(discounting=1.5), ValueError, "0 < discounting <= 1"),
    ("gae_lambda=-0.1", config(gae_lambda=-0.1), ValueError, "gae_lambda"),
    ("gae_lambda=2", config(gae_lambda=2.0), ValueError, "gae_lambda"),
    ("learning_rate=0", config(learning_rate=0.0), ValueError, "learning_rate must be > 0"),
    ("learning_rate<0", config(learning_rate=-1e-3), ValueError, "learning_rate must be > 0"),
    *[
        (f"clipping={v}", config(clipping_epsilon=v), ValueError, "clipping_epsilon must be in")
        for v in (0.0, -0.2, 1.0, 2.0)
    ],
    ("reward_scaling=0", config(reward_scaling=0.0), ValueError, "reward_scaling must be > 0"),
    ("entropy<0", config(entropy_cost=-0.1), ValueError, "entropy_cost must be >= 0"),
    ("value_coef<0", config(value_loss_coef=-1.0), ValueError, "value_loss_coef must be >= 0"),
    ("max_grad_norm=0", config(max_grad_norm=0.0), ValueError, "max_grad_norm must be > 0"),
    # -- the compiled pieces: states, sizes, keys --
    ("num_steps=0", run_train(0), ValueError, "num_steps must be >= 1"),
    ("num_steps=-100", run_train(-100), ValueError, "num_steps must be >= 1"),
    ("num_steps=nan", run_train(math.nan), TypeError, "num_steps must be an int"),
    ("num_steps=str", run_train("abc"), TypeError, "num_steps must be an int"),
    ("num_steps=2.5", run_train(2.5), TypeError, "num_steps must be an int"),
    ("num_steps=True", run_train(True), TypeError, "num_steps must be an int"),
    *[
        (f"chunks={v!r}", run_train(chunks=v), ValueError, "chunks must be an int >= 1")
        for v in (0, -3, 2.5)
    ],
    *[
        (
            f"train {name}={v!r}",
            lambda name=name, v=v: ppo.train(
                env(), ppo.PPOConfig(**SMALL), **{"num_timesteps": 1000, name: v}, space=space()
            ),
            ValueError,
            f"train: {name} must be an int >= 1",
        )
        for name, v in (
            ("num_timesteps", 0),
            ("num_timesteps", -1000),
            ("num_timesteps", 1000.7),
            ("segments", 0),
            ("segments", -1),
        )
    ],
    ("env state of 16 envs", lambda: run_train(es=other_size_state())(), ValueError, "num_envs"),
    (
        "ts of another agent",
        lambda: run_train(ts=other_config_state())(),
        ValueError,
        "does not match",
    ),
    ("env state not a state", run_train(es={"x": 1}), TypeError, "must be an EnvState"),
    ("ts not a state", run_train(ts=[1]), TypeError, "must be a TrainingState"),
    (
        "context of other names",
        run_train(context=C.ContextSpace({"mass": C.Scale(0.5, 1.5)})),
        ValueError,
        "same names",
    ),
    ("context not a space", run_train(context={"gravity": (5, 6)}), ValueError, "ContextSpace"),
    (
        "per-env ranges of another size",
        run_train(context=C.PerEnv(jax.tree.map(lambda x: np.stack([x] * 3), G))),
        ValueError,
        "parameter shapes differ",
    ),
    (
        "context out of physics",
        run_train(context=C.ContextSpace({"gravity": C.Uniform(-50.0, -45.0)})),
        ValueError,
        "must be >= 0",
    ),
    (
        "per-env ranges with an infinite bound",
        run_train(context=C.PerEnv(jax.tree.map(lambda x: np.stack([x, x * np.inf] * 4), G))),
        ValueError,
        "Uniform.low must be finite",
    ),
    ("init_env_state(0)", lambda: ppo.init_env_state(space(), 0), TypeError, "typed PRNG key"),
    ("init_training(0)", lambda: ppo.init_training_state(space(), 0), TypeError, "typed PRNG key"),
    (
        "batch of keys without seed axis",
        lambda: ppo.init_training_state(space(), jax.random.split(jax.random.key(0), 2)),
        ValueError,
        "a single key",
    ),
    (
        "make_train_space(str)",
        lambda: ppo.make_train_space("puck", ppo.PPOConfig()),
        ValueError,
        "ContextualEnv",
    ),
    ("make_train_space(dict)", lambda: ppo.make_train_space(env(), {}), ValueError, "PPOConfig"),
    (
        "stock_depth without a stock",
        lambda: ppo.make_train_space(
            make_contextual(Puck(), G, episode_length=20, reset_strategy="loop"),
            ppo.PPOConfig(**SMALL, stock_depth=2),
        ),
        ValueError,
        "(reset_strategy=\"stock\"); this env resets with 'loop': drop stock_depth",
    ),
    *[
        (  # a string failed at the first reset ("'<' not supported"); True read as 1.0
            f"reset_chunk={chunk!r}",
            lambda chunk=chunk: make_contextual(Puck(), G, reset_chunk=chunk),
            ValueError,
            f"reset_chunk must be a fraction of the batch in (0, 1], got {chunk!r}",
        )
        for chunk in ("x", True)
    ],
    (
        "num_seeds=0",
        lambda: ppo.make_train_space(env(), ppo.PPOConfig(**SMALL), 0),
        ValueError,
        "num_seeds",
    ),
    (
        "categorical on a continuous env",
        lambda: space(action_distribution="categorical"),
        ValueError,
        "does not fit this env",
    ),
    (
        "hidden_size with the mlp core, which has no recurrent core",
        lambda: ppo.PPOConfig(hidden_size=32),
        ValueError,
        "hidden_size=32 sizes a recurrent core",
    ),
    (  # no episode boundary differs from a trial's: a setting that changed nothing
        "reset_every_episode with one episode per trial",
        lambda: ppo.make_train_space(
            make_contextual("inverted_pendulum", G),
            ppo.PPOConfig(core="gru", reset_every_episode=True, returns_span="episode"),
        ),
        ValueError,
        'reset_every_episode=True and returns_span="episode" would change nothing',
    ),
    (
        "reset_every_episode with nothing to reset",
        lambda: ppo.PPOConfig(reset_every_episode=True),
        ValueError,
        "reset_every_episode=True has nothing to reset",
    ),
    # -- contexts --
    ("unknown name", bind({"gravitee": C.Uniform(1.0, 2.0)}), ValueError, "unknown context name"),
    ("low > high", lambda: C.Uniform(2.0, 1.0), ValueError, "low <= high"),
    # finite bounds, but every draw low + u (high - low) was inf
    ("uniform span", lambda: C.Uniform(-2e38, 2e38), ValueError, "high - low overflows float32"),
    ("negative std", lambda: C.Normal(1.0, -1.0), ValueError, "std"),
    ("probs sum", lambda: C.Choice([1.0, 2.0], [0.5, 0.6]), ValueError, "sum to 1"),
    ("shapes", lambda: C.Uniform([1.0, 2.0], [2.0, 3.0, 4.0]), ValueError, "do not broadcast"),
    ("loguniform <= 0", lambda: C.LogUniform(0.0, 1.0), ValueError, "LogUniform"),
    ("nan bound", lambda: C.Uniform(math.nan, 1.0), ValueError, "finite"),
    ("flags not bool", lambda: C.Uniform(1.0, 2.0, relative="yes"), ValueError, "True or False"),
    ("normal mass", bind({"mass": C.Normal(1.0, 0.1)}), ValueError, "must be >"),
    ("negative mass", bind({"mass": C.Uniform(-1.0, 1.0)}), ValueError, "must be >"),
    (
        "raw negative mass",
        bind({"link.inertia.mass[1]": C.Uniform(-5.0, -1.0)}),
        ValueError,
        "must be > 0",
    ),
    ("raw timestep 0", bind({"opt.timestep": C.Fixed(0.0)}), ValueError, "must be > 0"),
    (
        "two names, one field",
        bind({"mass": C.Scale(0.5, 2.0), "link.inertia.mass": C.Uniform(1.0, 2.0)}),
        ValueError,
        "both write System field",
    ),
    (  # the relative entry writes 0 over the raw draw where the default is 0 (dof z)
        "raw path under a relative entry, zero default",
        bind({"dof.damping[1]": C.Uniform(1.0, 2.0), "dof.damping": C.Scale(0.5, 1.5)}, "puck"),
        ValueError,
        "both write System field dof.damping",
    ),
    (  # the selection rewrites every element of both copies from the MJX copy
        "canonical selection after a raw path",
        bind({"dof.damping": C.Scale(0.5, 1.5), "damping[z]": C.Uniform(1.0, 2.0)}, "puck"),
        ValueError,
        "both write System field dof.damping",
    ),
    (
        "raw slice selects nothing",
        bind({"geom_friction[10:20, 0]": C.Uniform(0.1, 1.0)}),
        ValueError,
        "selects no element of field 'geom_friction' of shape (3, 3)",
    ),
    ("raw slice step 0", bind({"geom_friction[::0, 0]": C.Uniform(0.1, 1.0)}), ValueError, "step"),
    (  # the README's example once did this: hopper's trajectory unchanged to 0.0
        "raw torsional friction on a Brax backend",
        bind({"geom_friction[:, 1]": C.Fixed(0.05)}, "hopper", backend="generalized"),
        ValueError,
        "reads the sliding friction (column 0) alone",
    ),
    (
        "raw rolling friction where no geom has condim 6",
        bind({"geom_friction[:, 1:]": C.Fixed(0.05)}, "hopper", backend="mjx"),
        ValueError,
        "no geom has the condim its columns [1, 2] need",
    ),
    ("raw negative inertia", bind({"link.inertia.i": C.Scale(-1.0, -0.5)}), ValueError, "> 0"),
    ("raw path missing", bind({"link.nothing": C.Uniform(1.0, 2.0)}), ValueError, "no field"),
    ("raw index", bind({"geom_friction[99, 0]": C.Uniform(0.1, 1.0)}), ValueError, "index"),
    (
        "per_element scalar",
        bind({"gravity": C.Uniform(5.0, 15.0, per_element=True)}),
        ValueError,
        "per_element",
    ),
    (
        "elasticity generalized",
        bind({"elasticity": C.Uniform(0.0, 0.5)}),
        ValueError,
        "only the positional and spring backends",
    ),
    (
        "viscosity implicitfast",
        lambda: C.bind(
            C.ContextSpace({"viscosity": C.Uniform(0.0, 0.1)}),
            mjx.put_model(mujoco.MjModel.from_xml_string(IMPLICITFAST)),
            "mjx",
        ),
        ValueError,
        "with this model's implicitfast integrator",
    ),
    (
        "relative per element over zero defaults",  # puck: joint z has no damping
        bind({"damping": C.Scale(0.5, 2.0, per_element=True)}, name="puck"),
        ValueError,
        "dofs z have default 0 in this env, so a relative scale drawn for each element would "
        "change nothing there; name the others ('damping[x, spin]')",
    ),
    (
        "scaled about per-element defaults, one range",
        lambda: C.ContextSpace({"mass": C.Uniform(1.0, 5.0, per_element=True)}).scaled(
            0.5, around={"mass": np.array([1.0, 2.0], np.float32)}
        ),
        ValueError,
        "'mass' cannot be scaled about its per-element defaults [1, 2]",
    ),
    (
        "scaled about per-element defaults, Choice",
        lambda: C.ContextSpace({"mass": C.Choice([2.0, 3.0], per_element=True)}).scaled(
            0.5, around={"mass": np.array([1.0, 2.0], np.float32)}
        ),
        ValueError,
        "a Choice's values are one list",
    ),
    (
        "per-element shape",
        bind({"mass": C.Scale([0.5] * 7, [2.0] * 7, per_element=True)}),
        ValueError,
        "does not fit",
    ),
    # -- make_contextual --
    ("bad backend", bind({}, backend="physx"), ValueError, "backend should be in"),
    ("unknown env", bind({}, name="pendulum9"), ValueError, "unknown Brax env"),
    ("env object", lambda: make_contextual(object(), G), ValueError, "Brax env name"),
    ("episode_length=0", bind({}, episode_length=0), ValueError, "episode_length"),
    ("episodes_per_trial=0", bind({}, episodes_per_trial=0), ValueError, "episodes_per_trial"),
    ("visible_context", bind({}, visible_context="yes"), ValueError, "visible_context"),
    ("reset_chunk=0", bind({}, reset_chunk=0.0), ValueError, "chunk"),
    ("reset_chunk=2", bind({}, reset_chunk=2.0), ValueError, "chunk"),
    (
        "env_kwargs on instance",
        lambda: make_contextual(Puck(), G, n_frames=3),
        ValueError,
        "env_kwargs",
    ),
    # -- env calls --
    ("reset(0)", lambda: env().reset(0), TypeError, "PRNG key"),
    (
        "jitted reset with other flags",
        lambda: jax.jit(env().reset)(
            jax.random.key(0), C.ContextSpace({"gravity": C.Scale(0.5, 1.5)})
        ),
        ValueError,
        "must keep the flags relative=False",
    ),
    (
        "reset with other names",
        lambda: env().reset(jax.random.key(0), C.ContextSpace({"mass": C.Scale(0.5, 1.0)})),
        ValueError,
        "same names",
    ),
    (
        "reset with unphysical ranges",
        lambda: env().reset(
            jax.random.key(0), C.ContextSpace({"gravity": C.Uniform(-50.0, -45.0)})
        ),
        ValueError,
        "must be >= 0",
    ),
    (
        "reset with NaN ranges rebuilt by tree.map",
        lambda: env().reset(jax.random.key(0), jax.tree.map(lambda x: x * np.nan, G)),
        ValueError,
        "Uniform.low must be finite",
    ),
    (
        "set_ranges with swapped bounds rebuilt by tree.map",
        lambda: env().set_ranges(env().reset(jax.random.key(0)), swapped_ranges()),
        ValueError,
        "low <= high",
    ),
    (
        "step with a batch of actions",
        lambda: env().step(env().reset(jax.random.key(0)), np.zeros((4, 1))),
        ValueError,
        "action of shape",
    ),
    (
        "step with too many action dims",
        lambda: env().step(env().reset(jax.random.key(0)), np.zeros(3)),
        ValueError,
        "expected (1,)",
    ),
    # -- curricula --
    ("widening start 0", lambda: curricula.LinearWidening(0.0, 3), ValueError, "start"),
    ("widening segments 0", lambda: curricula.LinearWidening(0.5, 0), ValueError, "segments"),
    ("geometric start 2", lambda: curricula.GeometricWidening(2.0, 3), ValueError, "start"),
    ("gated step 0", lambda: curricula.PerformanceGated(0.5, 0.0, 100.0), ValueError, "step"),
    (
        "gated metric",
        lambda: curricula.PerformanceGated(0.5, 0.1, 1.0, metric="x"),
        ValueError,
        "metric",
    ),
    (
        "gated relative threshold as a percentage",
        lambda: curricula.PerformanceGated(0.2, 0.3, 90.0, relative=True),
        ValueError,
        "percentage",
    ),
    ("adr thresholds", lambda: curricula.ADR(0.5, 0.1, 10.0, 5.0, 4), ValueError, "wrong order"),
    ("adr buffer", lambda: curricula.ADR(0.5, 0.1, 1.0, 5.0, 0), ValueError, "buffer_size"),
    ("adr prob", lambda: curricula.ADR(0.5, 0.1, 1.0, 5.0, 4, 1.5), ValueError, "boundary_prob"),
    (
        "adr no key",
        lambda: curricula.ADR(0.5, 0.1, 1.0, 5.0, 4).init(G, num_envs=4),
        ValueError,
        "key",
    ),
    (
        "target not space",
        lambda: curricula.LinearWidening(0.5, 2).init({"g": 1}),
        ValueError,
        "ContextSpace",
    ),
    # -- evaluation --
    (
        "extrapolation factor",
        lambda: E.extrapolation(env(), G, 4, factor=1.0),
        ValueError,
        "factor > 1",
    ),
    (
        "extrapolation side",
        lambda: E.extrapolation(env(), G, 4, side="left"),
        ValueError,
        "side must be",
    ),
    (
        "grid of 3 names",
        lambda: E.grid(G, {"a": [1], "b": [2], "c": [3]}),
        ValueError,
        "one or two",
    ),
    ("evaluator episodes", lambda: E.Evaluator(env(), episodes=0), ValueError, ">= 1"),
    (
        "evaluator episodes 4.0",
        lambda: E.Evaluator(env(), episodes=4.0),
        ValueError,
        "episodes must be an integer >= 1, got 4.0",
    ),
    (
        "extrapolation factor inf",  # drew a mass of inf
        lambda: E.extrapolation(env(), G, 4, factor=math.inf),
        ValueError,
        "a finite factor > 1",
    ),
    (  # said "TypeError: 'int' object is not iterable"
        "check_compatible batch_shape int",
        lambda: G.check_compatible(G, batch_shape=3),
        ValueError,
        "batch_shape must be a tuple of sizes, () or (num_envs,), got 3",
    ),
    ("in_distribution num -1", lambda: E.in_distribution(G, -1), ValueError, "num must be"),
    (  # one number per context would pin every body alike, where training draws each
        "in_distribution per element without env",
        lambda: E.in_distribution(C.ContextSpace({"mass": C.Scale(0.5, 2.0, per_element=True)}), 3),
        ValueError,
        "pass env=",
    ),
    (  # a per-element Choice was not refused: it pinned every body alike
        "interpolation per-element Choice without env",
        lambda: E.interpolation(
            C.ContextSpace({"mass": C.Choice([0.5, 1.0, 2.0], relative=True, per_element=True)}), 3
        ),
        ValueError,
        "pass env=",
    ),
    (  # ran, and averaged the returns of the broken physics into the split's
        "evaluate a context beyond a physical limit",
        lambda: E.Evaluator(env(), 1, 2).evaluate(
            None, E.ContextSet("grid", {"gravity": np.array([9.8, -9.8], np.float32)}), None
        ),
        ValueError,
        "context set 'grid': context 'gravity': Uniform can produce -9.8, but gravity values "
        "(m/s^2) must be >= 0. Use values that keep it physical",
    ),
    (  # said "Uniform.low must be finite, got nan", naming neither context nor set
        "evaluate a NaN context",
        lambda: E.Evaluator(env(), 1, 2).evaluate(
            None, E.ContextSet("grid", {"gravity": np.array([9.8, np.nan], np.float32)}), None
        ),
        ValueError,
        "context set 'grid': context 'gravity' is nan in its context 1",
    ),
    (  # blamed the env: "context ... is identical in all 1 envs after reset"
        "check_env of one env",
        lambda: check_env(env(), num_envs=1),
        ValueError,
        "num_envs must be an integer >= 2 (contexts drawn per env are compared",
    ),
    (  # "cannot reshape array of size 0"
        "check_env of no steps",
        lambda: check_env(env(), max_steps=0),
        ValueError,
        "max_steps must be an integer >= 1, got 0",
    ),
    (  # the advice was for a Normal: "Uniform, LogUniform or TruncatedNormal instead"
        "a Normal mass",
        lambda: make_contextual(Puck(), C.ContextSpace({"mass": C.Normal(1.0, 0.1)})),
        ValueError,
        "A Normal is unbounded: use Uniform, LogUniform or TruncatedNormal",
    ),
    (
        "a Uniform mass from 0",
        lambda: make_contextual(Puck(), C.ContextSpace({"mass": C.Scale(0.0, 2.0)})),
        ValueError,
        "must be > 0. Use bounds that keep it physical",
    ),
    (  # trained segments (checkpointed) until a widening curriculum reached the bad end
        "experiment target beyond a physical limit",
        lambda: experiment.Experiment(
            env(),
            C.ContextSpace({"gravity": C.Uniform(-5.0, 15.0)}),
            curricula.LinearWidening(0.1, 4),
            ppo.PPOConfig(**SMALL),
        ),
        ValueError,
        "the experiment's target: context 'gravity'",
    ),
    (  # failed on a missing method once the first segment had compiled
        "experiment without a curriculum",
        lambda: experiment.Experiment(env(), G, None, ppo.PPOConfig(**SMALL)),
        TypeError,
        "use curricula.LinearWidening(start=1.0, segments=1)",
    ),
    (
        "experiment of a PPO config given as a dict",
        lambda: experiment.Experiment(env(), G, curricula.LinearWidening(1.0, 1), dict(SMALL)),
        TypeError,
        "Experiment.ppo must be a PPOConfig",
    ),
    (  # compiled every program, then failed on the heatmap of no names
        "experiment of an empty target",
        lambda: experiment.Experiment(
            make_contextual(Puck(), C.ContextSpace({})),
            C.ContextSpace({}),
            curricula.LinearWidening(1.0, 1),
            ppo.PPOConfig(**SMALL),
        ),
        ValueError,
        "Experiment.target names no context",
    ),
    (  # JAX clamps the index: "seed 5" was seed 1
        "select_seed past the end",
        lambda: ppo.select_seed({"w": np.zeros((2, 3))}, 5),
        ValueError,
        "run k=5 outside 0..1",
    ),
    ("seed_keys num_seeds 0", lambda: ppo.seed_keys(5, 0), ValueError, "num_seeds must be"),
    (  # the 1.5 was ignored: a relative range scales about x1
        "scaled about a relative entry's default other than 1",
        lambda: C.ContextSpace({"mass": C.Scale(0.5, 2.0)}).scaled(0.5, around={"mass": 1.5}),
        ValueError,
        "'mass' is relative",
    ),
    (
        "scaled about an unknown name",
        lambda: G.scaled(0.5, around={"gravity": 9.8, "gravty": 3.0}),
        ValueError,
        "unknown ['gravty']",
    ),
    (
        "curriculum defaults for a relative entry",
        lambda: curricula.LinearWidening(0.5, 2).init(
            C.ContextSpace({"mass": C.Scale(0.5, 2.0)}), defaults={"mass": 1.5}
        ),
        ValueError,
        "'mass' is relative",
    ),
    # -- checkpoints, logging, runner --
    (
        "save step -1",
        lambda: checkpoint.save("/tmp/never", -1, {"x": np.ones(2)}),
        ValueError,
        "step",
    ),
    (
        "save step str",
        lambda: checkpoint.save("/tmp/never", "1", {"x": np.ones(2)}),
        ValueError,
        "step",
    ),
    (
        "save keep 0",
        lambda: checkpoint.save("/tmp/never", 1, {"x": np.ones(2)}, keep=0),
        ValueError,
        "keep",
    ),
    (  # said "no checkpoint step 5 ...; available steps: [5]"
        "restore step str",
        lambda: checkpoint.restore("/tmp/never-there", {}, step="5"),
        ValueError,
        "checkpoint step must be an integer >= 0, got '5'",
    ),
    (
        "restore missing",
        lambda: checkpoint.restore("/tmp/never-there", {}),
        FileNotFoundError,
        "no checkpoint",
    ),
    (
        "logger names str",
        lambda: RunLogger("/tmp/never", "gravity"),
        TypeError,
        "sequence of names",
    ),
    (
        "run resume mode",
        lambda: experiment.run(
            None, logdir="/tmp/x", segments=1, steps_per_segment=1, seed=0, resume="sometimes"
        ),
        ValueError,
        "resume must be one of",
    ),
    (
        "run keep_checkpoints -1",
        lambda: experiment.run(
            None, logdir="/tmp/x", segments=1, steps_per_segment=1, seed=0, keep_checkpoints=-1
        ),
        ValueError,
        "keep_checkpoints must be >= 1 (the latest segments' kept) or 0 (every segment's)",
    ),
    (
        "run_variants keep_checkpoints 1.5",
        lambda: experiment.run_variants(
            {"a": None},
            logdir="/tmp/x",
            segments=1,
            steps_per_segment=1,
            seed=0,
            keep_checkpoints=1.5,
        ),  # fmt: skip
        ValueError,
        "keep_checkpoints must be an integer, got 1.5",
    ),
    (
        "run segments 0",
        lambda: experiment.run(None, logdir="/tmp/x", segments=0, steps_per_segment=1, seed=0),
        ValueError,
        "segments must be",
    ),
    (
        "run steps str",
        lambda: experiment.run(None, logdir="/tmp/x", segments=1, steps_per_segment="9", seed=0),
        ValueError,
        "steps_per_segment must be",
    ),
    ("eval contexts 0", lambda: experiment.EvalConfig(contexts=0), ValueError, "eval.contexts"),
    ("eval episodes 0", lambda: experiment.EvalConfig(episodes=0), ValueError, "eval.episodes"),
    (
        "eval heatmap_points 1",
        lambda: experiment.EvalConfig(heatmap_points=1),
        ValueError,
        "eval.heatmap_points must be an integer >= 2",
    ),
    (
        "eval factor 1",
        lambda: experiment.EvalConfig(extrapolation_factor=1.0),
        ValueError,
        "extrapolation_factor must be a number > 1",
    ),
    (
        "eval heatmap 3 names",
        lambda: experiment.EvalConfig(heatmap=("a", "b", "c")),
        ValueError,
        "one or two context names",
    ),
    (
        "eval heatmap twice",
        lambda: experiment.EvalConfig(heatmap=("a", "a")),
        ValueError,
        "names one context twice",
    ),
    (
        "eval probe -1",
        lambda: experiment.EvalConfig(probe=-1),
        ValueError,
        "eval.probe must be an integer >= 0",
    ),
    (  # a feed-forward agent has no memory to probe: refused before it trains
        "eval probe of an mlp",
        lambda: experiment.Experiment(
            env(),
            G,
            curricula.LinearWidening(1.0, 1),
            ppo.PPOConfig(**SMALL),
            experiment.EvalConfig(probe=2),
        ),
        ValueError,
        "ppo.core is 'mlp', which keeps none: use core='gru' or 'lstm', or eval.probe=0",
    ),
    (
        "eval probe of a fixed target",
        lambda: experiment.Experiment(
            env(),
            C.ContextSpace({"gravity": C.Uniform(9.8, 9.8)}),
            curricula.LinearWidening(1.0, 1),
            ppo.PPOConfig(**SMALL, core="gru"),
            experiment.EvalConfig(probe=2),
        ),
        ValueError,
        "no context of the target varies",
    ),
    (
        "run args ppo seed",
        lambda: experiment.RunArgs(seed=3).seeded(ppo.PPOConfig(seed=7)),
        SystemExit,
        "--ppo.seed 7 and --seed 3 disagree",
    ),
]


def test_the_logger_refuses_a_metric_or_step_that_is_not_one_number(tmp_path):
    """log_hparams once dropped an array metric and wrote the string "3" as 3.0, and
    a step of 2.9 was logged at 2."""
    log = RunLogger(tmp_path, ["gravity"])
    with pytest.raises(TypeError, match="final_return: a scalar number is needed"):
        log.log_hparams({"lr": 1e-3}, {"final_return": np.ones(3)})
    with pytest.raises(TypeError, match="gap: a scalar number is needed"):
        log.log_hparams({"lr": 1e-3}, {"gap": "3"})
    with pytest.raises(TypeError, match="a step must be a whole number, got 2.9"):
        log.log_scalars(2.9, {"train/return": 1.0})
    log.log_scalars(np.float64(3.0), {"train/return": 1.0})  # a whole number is one
    log.close()


def test_the_table_is_large_and_ids_are_unique():
    ids = [row[0] for row in ROWS]
    assert len(ROWS) >= 100 and len(set(ids)) == len(ids)


@pytest.mark.parametrize("make, error, phrase", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input_gets_a_clear_error(make, error, phrase):
    with pytest.raises(error) as info:
        make()
    assert phrase.lower() in str(info.value).lower(), str(info.value)


def test_an_adr_segment_too_short_for_whole_trials_is_refused_before_anything_runs(tmp_path):
    # Puck's episodes last 20 steps here; SMALL trains 8 envs x 4 steps per iteration.
    # ADR credits only trials begun and ended inside a segment: 64 steps per segment are
    # 8 per env, and the refusal names the least budget that fits 2 trials per env.
    def exp(curriculum):
        return experiment.Experiment(env(), G, curriculum, ppo.PPOConfig(**SMALL))

    adr = exp(curricula.ADR(0.5, 0.1, 1.0, 5.0, 4))
    with pytest.raises(ValueError, match=r"8 steps per segment.*steps_per_segment >= 320"):
        experiment.run(adr, logdir=tmp_path / "a", segments=1, steps_per_segment=64, seed=0)
    experiment.check_segment_length(adr, 320)  # 10 iterations: 40 steps per env
    with pytest.raises(ValueError, match="steps_per_segment >= 320"):
        experiment.check_segment_length(adr, 288)  # 9 iterations: 36 steps per env
    experiment.check_segment_length(exp(curricula.LinearWidening(0.5, 2)), 64)  # shared ranges
    # a curriculum of your own functions (no `params`) is checked alike
    own = adr.curriculum
    own = exp(types.SimpleNamespace(init=own.init, update=own.update, ranges=own.ranges))
    with pytest.raises(ValueError, match="steps_per_segment >= 320"):
        experiment.check_segment_length(own, 288)
    experiment.check_segment_length(own, 320)
    # run_variants refuses before its first variant trains
    variants = {"fixed": exp(curricula.LinearWidening(1.0, 1)), "adr": adr}
    with pytest.raises(ValueError, match="per-env curriculum"):
        experiment.run_variants(
            variants, logdir=tmp_path / "v", segments=1, steps_per_segment=64, seed=0
        )
    assert not (tmp_path / "a").exists() and not (tmp_path / "v").exists()


def test_a_gate_on_the_training_return_with_a_segment_shorter_than_two_trials_is_refused(
    tmp_path,
):
    # Puck's episodes last 20 steps here; SMALL trains 8 envs x 4 steps per iteration. The
    # gate reads the episodes of trials that start within the segment (on its own
    # ranges): with 16 steps per env none need start and end, and the gate would read
    # NaN and hold for good; as ADR, it needs 2 trials' worth of steps per env.
    def exp(metric):
        gate = curricula.PerformanceGated(0.5, 0.25, 1.0, metric=metric)
        return experiment.Experiment(env(), G, gate, ppo.PPOConfig(**SMALL))

    gated = exp("episode_return")
    with pytest.raises(
        ValueError,
        match=r"16 steps per segment, under 2 trials of 20 steps.*"
        r"steps_per_segment >= 320, or metric='eval_return'",
    ):
        experiment.run(gated, logdir=tmp_path / "g", segments=1, steps_per_segment=128, seed=0)
    assert not (tmp_path / "g").exists()
    with pytest.raises(ValueError, match=r"36 steps per segment.*>= 320, or metric="):
        experiment.check_segment_length(gated, 288)
    experiment.check_segment_length(gated, 320)  # 10 iterations: 40 steps per env
    experiment.check_segment_length(exp("eval_return"), 64)  # evaluated on whole episodes


def test_a_stock_depth_that_auto_leaves_unused_on_this_device_warns():
    """The same config stocks on a GPU, where "auto" is the stock; on a CPU it is the
    loop, and the depth is unused: said, not silently."""
    with pytest.warns(UserWarning, match=r"stock_depth=2 .* which \"auto\" chose .*: unused"):
        s = ppo.make_train_space(env(), ppo.PPOConfig(**SMALL, stock_depth=2))
    assert s.stock_depth is None


def test_numpy_numbers_and_lists_make_the_same_config_as_python_ones():
    """A config built from NumPy scalars (a sweep over np.linspace) or a list of layer
    sizes (a YAML file) is the config of the same Python values: equal, hashable, and
    fit for the same train space."""
    plain = ppo.PPOConfig(num_envs=8, learning_rate=1e-3, policy_hidden=(32, 32), seed=3)
    numpy = ppo.PPOConfig(
        num_envs=np.int64(8),
        learning_rate=np.float64(1e-3),
        policy_hidden=[np.int32(32), 32],
        seed=np.uint32(3),
    )
    assert numpy == plain and hash(numpy) == hash(plain)
    assert type(numpy.num_envs) is int and type(numpy.policy_hidden) is tuple
    low = ppo.PPOConfig(learning_rate=np.float32(1e-3))
    assert type(low.learning_rate) is float and low.learning_rate == float(np.float32(1e-3))
    # the env's counts alike (make_contextual refused np.int64(20) as "not an integer")
    made = make_contextual(Puck(), G, episode_length=np.int64(20), episodes_per_trial=np.int32(2))
    assert (made.episode_length, made.episodes_per_trial) == (20, 2)
    assert type(made.episode_length) is int


def test_a_policy_of_a_multi_seed_state_names_select_seed():
    seeds = ppo.make_train_space(env(), ppo.PPOConfig(**SMALL), num_seeds=2)
    ts = ppo.init_training_state(seeds, ppo.seed_keys(0, 2))
    with pytest.raises(ValueError, match=r"holds 2 seeds.*select_seed\(training_state, k\)"):
        ppo.make_policy(seeds, ts)
    policy = ppo.make_policy(seeds, ppo.select_seed(ts, 1))
    obs = jax.numpy.zeros((3, env().observation_size))
    action, _ = policy(obs, policy.init_carry(3))
    assert action.shape == (3, env().action_size)


def test_a_policy_refuses_observations_of_another_env():
    """A policy trained with the context visible, run on the env without it (or on one
    env's unbatched vector), failed deep inside: a broadcasting TypeError, vmap's sizes."""
    visible = make_contextual(Puck(), G, episode_length=20, visible_context=True)
    space = ppo.make_train_space(visible, ppo.PPOConfig(**SMALL))
    policy = ppo.make_policy(space, ppo.init_training_state(space, jax.random.key(0)))
    size = visible.observation_size
    policy(jax.numpy.zeros((3, size)), policy.init_carry(3))  # the env it was trained on
    for obs in (jax.numpy.zeros((3, size - 1)), jax.numpy.zeros(size)):
        with pytest.raises(ValueError, match=rf"per-env shape .* trained on \({size},\)"):
            policy(obs, policy.init_carry(3))
    with pytest.raises(ValueError, match="the same context space and visible_context"):
        act = jax.jit(lambda policy, obs, carry: policy(obs, carry))
        act(policy, {"state": jax.numpy.zeros((3, size))}, policy.init_carry(3))
