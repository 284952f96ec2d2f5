"""What a recurrent agent's memory knows about the hidden context: a linear probe.

An RL^2 agent that acts well in a context it does not observe may have inferred
that context, or may act well without representing it. The probe asks the
memory directly: `record_memory` runs trials in chosen contexts (a `ContextSet`,
through an `Evaluator`, as held-out evaluation runs them) and keeps the
policy's core state after every step's observation; `fit_probe` fits a ridge
regression from that state to the context the env ran (``state.info``'s
values, in draw units: a relative entry's scale, one dimension per element of
a per-element entry); `score_probe` scores it on another recording, per
episode of the trial and per step, against the fit set's mean: out-of-sample
R^2 = 1 - MSE / MSE of predicting the fit contexts' mean (1: decoded exactly;
0: no better than knowing only the training distribution; negative: worse).

Fit on contexts drawn from the training ranges and score on fresh ones, and on
held-out splits: a memory whose code for the context holds out of distribution
scores there as in it. Score the agent's initial parameters too, on the trained
policy's observation normalizer (the initial one passes raw observations): a
random recurrent network fed actions and rewards already carries some of the
context, so what training adds is the difference (`experiments/probe_memory.py`
does both, over seeds). `fit_and_score` fits on several recordings and scores every
held-out split at once: the runner calls it after each segment where
``EvalConfig.probe`` asks, so the probe's figures follow training. Only the
policy's core is probed (the value tower has its own); a feed-forward agent has
no memory to probe and is refused.

A probe says what the memory holds, not what the policy acts on. `steer` asks
that: it runs the trials with the memory edited at every step, after the core
updates it and before the action head reads it, so that the probe decodes a
chosen context (by default each env's own: a memory corrected to hold the
context it runs in), and returns the evaluation's returns. The edit moves the
memory the way it moves when the context changes (``along="encoding"``, the
regression of the memory on the context), or by the least change that moves the
readout (``along="readout"``): the two can differ by an order of magnitude in
size, the readout's direction being nearly orthogonal to the encoding's. If
the return moves with the decoded context, the policy acts on that code.
`control_policy` is the check that a return change is the code's and not any
push's: it replays a steered run's edits, env by env and step by step at their
recorded sizes, along one fixed direction the probe does not read (it decodes
what it did). ``strength`` scales the edit (0: none, the plain policy's
evaluation exactly).
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from metarl.envs import CONTEXT, TRIAL
from metarl.evaluation import ContextSet, EvalResult, Evaluator


@dataclasses.dataclass(frozen=True)
class Memory:
    """One recording: N = contexts x trials envs, each running one trial of T =
    episodes_per_trial x episode_length steps at most."""

    split: str
    features: np.ndarray  # [N, T, H]: the policy core's state after each step's observation
    episode: np.ndarray  # [N, T] int: the step's episode in the trial; -1 after the trial ended
    targets: np.ndarray  # [N, D]: the context the env ran, flattened over names and elements
    names: tuple[str, ...]  # [D]: each target dimension, "name" or "name[i]"
    context: np.ndarray  # [N] int: the index of the env's context in the ContextSet
    episodes_per_trial: int


def _dimension_names(env) -> tuple[str, ...]:
    out = []
    for entry in env.binding.entries:
        size = int(np.prod(entry.draw_shape))
        out += [entry.name] if not entry.draw_shape else [f"{entry.name}[{i}]" for i in range(size)]
    return tuple(out)


def _memory_states(policy, who: str, refusal: str) -> list:
    """The leaves of `policy`'s core state for one env; refuses a core without memory
    (its message: "... which keeps no memory " + `refusal` + " an agent with ...")."""
    states = jax.tree.leaves(policy.init_carry(1).policy)
    if not states:
        raise ValueError(
            f"{who}: the agent's core is {policy.agent.core!r}, which keeps no memory "
            f"{refusal} an agent with core='gru' or 'lstm'"
        )
    return states


# how `steer` moves the memory: as it moves with the context, or by the least change
STEER_ALONG = ("encoding", "readout")

# env -> {(steps, envs): its jitted recording rollout}: one compilation per env and
# batch, shared by the evaluators that run batches of one size (a probe's fit set and the
# evaluation's, experiments/probe_memory.py), where evaluate compiles once per evaluator
_RECORDERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _rollout_shape(evaluator: Evaluator) -> tuple[int, int]:
    """(steps, envs) of one batch `evaluator` runs: a trial per env."""
    env = evaluator.env
    return env.episodes_per_trial * env.episode_length, evaluator.max_contexts * evaluator.trials


def _recorder(evaluator: Evaluator):
    """The jitted recording rollout of `evaluator`'s env and sizes."""
    steps, n = _rollout_shape(evaluator)
    built = _RECORDERS.setdefault(evaluator.env, {})
    if (steps, n) in built:
        return built[steps, n]
    held = weakref.ref(evaluator.env)  # the dict's value must not keep its key alive

    def rollout(policy, ranges, key):
        env = held()  # traced while a caller's evaluator holds it
        reset = functools.partial(env.reset, checked=True)  # `Evaluator.ranges` checked them
        state = jax.vmap(reset)(jax.random.split(key, n), ranges)
        targets = jnp.concatenate(
            [
                state.info[CONTEXT][e.name].reshape(n, -1).astype(jnp.float32)
                for e in env.binding.entries
            ],
            axis=-1,
        )

        def body(c, _):
            state, carry, active = c
            episode = jnp.where(active, state.info[TRIAL].episode, -1)
            action, carry = policy(state.obs, carry)
            memory = jnp.concatenate(
                [x.reshape(n, -1) for x in jax.tree.leaves(carry.policy)], axis=-1
            )
            state = jax.vmap(env.step)(state, action)
            carry = policy.observe(carry, action, state)
            return (state, carry, active & (state.info[TRIAL].new_trial == 0)), (memory, episode)

        init = (state, policy.init_carry(n), jnp.ones((n,), bool))
        (_, carry, _), (memory, episode) = jax.lax.scan(body, init, None, length=steps)
        return memory.swapaxes(0, 1), episode.swapaxes(0, 1), targets, carry

    built[steps, n] = jax.jit(rollout)
    return built[steps, n]


def record_memory(evaluator: Evaluator, policy, contexts: ContextSet, key: jax.Array) -> Memory:
    """Runs one trial per env (``evaluator.trials`` envs per context of `contexts`,
    the deterministic policy of a recurrent agent) and records its memory; one
    compilation per env and batch size (evaluators of one size share it) for every set
    and policy of its TrainSpace."""
    _memory_states(policy, "record_memory", "between steps; probe")
    ranges, c = evaluator.ranges(contexts)
    memory, episode, targets = map(np.asarray, _recorder(evaluator)(policy, ranges, key)[:3])
    keep = c * evaluator.trials  # the envs of the set's own contexts, not the padding
    return Memory(
        split=contexts.split,
        features=memory[:keep],
        episode=episode[:keep],
        targets=targets[:keep],
        names=_dimension_names(evaluator.env),
        context=np.repeat(np.arange(c), evaluator.trials),
        episodes_per_trial=evaluator.env.episodes_per_trial,
    )


@dataclasses.dataclass(frozen=True)
class LinearProbe:
    """context ~ standardized memory @ weights + mean, for the dimensions that vary in
    the fit set (`names`); `mean`, the fit contexts' mean, is also R^2's reference.
    `encoding` is the other way round: how the memory moves with the context
    (least squares of the raw memory on the centred context, over the same steps).
    The readout's direction need not be it: a probe may read the context off small
    directions that cancel the rest, while the memory moves along others."""

    names: tuple[str, ...]
    dims: np.ndarray  # [D'] indices of the probed dimensions in a Memory's targets
    feature_mean: np.ndarray  # [H]
    feature_scale: np.ndarray  # [H]
    weights: np.ndarray  # [H, D']
    # [D']: the fit contexts' mean over the recorded steps (the ridge's intercept: a
    # context whose trial ran longer counts for more steps)
    mean: np.ndarray
    encoding: np.ndarray  # [D', H]: the memory's change per unit of each context

    def predict(self, features: np.ndarray) -> np.ndarray:
        """[..., H] memory states -> [..., D'] decoded contexts."""
        x = (np.asarray(features, np.float64) - self.feature_mean) / self.feature_scale
        return x @ self.weights + self.mean


def _samples(memory: Memory, who: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features [S, H], targets [S, D], step [S, 2] = (episode, step in trial)) of every
    step inside a trial; a ValueError if any of them is not finite (one NaN unit would
    make every weight of a fit NaN, and every score NaN)."""
    env_index, step = np.nonzero(memory.episode >= 0)
    features = memory.features[env_index, step].astype(np.float64)
    for what, x in (("memory", features), ("contexts", memory.targets)):
        bad = ~np.isfinite(x)
        if bad.any():
            raise ValueError(
                f"{who}: recording {memory.split!r} holds {int(bad.sum())} non-finite "
                f"{what} values inside its trials; record a policy and contexts whose numbers "
                "are finite"
            )
    return (
        features,
        memory.targets[env_index].astype(np.float64),
        np.stack([memory.episode[env_index, step], step], -1),
    )


def fit_probe(memory: Memory | Sequence[Memory], ridge: float = 1.0) -> LinearProbe:
    """Ridge regression (penalty `ridge` on standardized features) from every step's
    memory to its context, one decoder for all steps of a trial; fitted on one
    recording or on several of one env together."""
    if not np.isfinite(ridge) or ridge <= 0:  # 0: singular for a unit that never moves
        raise ValueError(f"fit_probe: ridge must be a finite number > 0, got {ridge!r}")
    memories = [memory] if isinstance(memory, Memory) else list(memory)
    if not memories or any(m.names != memories[0].names for m in memories):
        raise ValueError(
            "fit_probe: give one recording or several of one env (the same context "
            f"dimensions), got {[m.names for m in memories]}"
        )
    samples = [_samples(m, "fit_probe") for m in memories]
    x, y = (np.concatenate([s[i] for s in samples]) for i in (0, 1))
    targets = np.concatenate([m.targets for m in memories])
    names = memories[0].names
    dims = np.flatnonzero(np.ptp(targets, axis=0) > 0)
    if not dims.size:
        raise ValueError(
            f"fit_probe: no context varies across the {len(targets)} envs of "
            f"{sorted({m.split for m in memories})} (dimensions {list(names)}): nothing to "
            "decode; record contexts drawn from the training ranges"
        )
    y = y[:, dims]
    feature_mean, feature_scale = x.mean(0), x.std(0)
    feature_scale = np.where(feature_scale > 0, feature_scale, 1.0)  # a unit that never moves
    z = (x - feature_mean) / feature_scale
    target_mean = y.mean(0)
    gram = z.T @ z + ridge * np.eye(z.shape[1])
    weights = np.linalg.solve(gram, z.T @ (y - target_mean))
    return LinearProbe(
        names=tuple(names[i] for i in dims),
        dims=dims,
        feature_mean=feature_mean,
        feature_scale=feature_scale,
        weights=weights,
        mean=target_mean,
        encoding=np.linalg.lstsq(y - target_mean, x - feature_mean, rcond=None)[0],
    )


@dataclasses.dataclass(frozen=True)
class ProbeScore:
    """A probe scored on one recording (R^2 averaged over the probed dimensions)."""

    split: str
    r2: float  # over every step of every trial
    by_episode: np.ndarray  # [episodes_per_trial]
    by_step: np.ndarray  # [T]: per step of the trial (NaN where no trial ran that long)
    error: np.ndarray  # [D']: root mean squared error per dimension, in the context's units
    error_by_episode: np.ndarray  # [episodes_per_trial, D']
    # [episodes_per_trial, D']: mean decoded minus true context; beyond the training
    # range, its sign says whether the code squeezes the contexts back toward it
    bias_by_episode: np.ndarray
    names: tuple[str, ...]  # [D']


def _r2(err: np.ndarray, ref: np.ndarray) -> float:
    """1 - MSE / reference MSE, per dimension, averaged; NaN without samples."""
    if not len(err):
        return float("nan")
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(np.mean(1.0 - np.mean(err**2, 0) / np.mean(ref**2, 0)))


def _mean(err: np.ndarray) -> np.ndarray:
    """Per dimension; NaN without samples."""
    return np.mean(err, 0) if len(err) else np.full(err.shape[1:], np.nan)


def _rmse(err: np.ndarray) -> np.ndarray:
    return np.sqrt(_mean(err**2))


def score_probe(probe: LinearProbe, memory: Memory) -> ProbeScore:
    """Out-of-sample R^2 of `probe` on `memory` (record it in other contexts, or at
    least with another key, than the fit's): per episode of the trial and step."""
    dims = tuple(memory.names[i] for i in probe.dims if i < len(memory.names))
    if dims != probe.names:
        raise ValueError(
            f"score_probe: recording {memory.split!r} has dimensions {list(memory.names)}, "
            "not those the probe was fitted on: record both with one env"
        )
    x, y, where = _samples(memory, "score_probe")
    if x.shape[1] != len(probe.feature_mean):
        raise ValueError(
            f"score_probe: recording {memory.split!r} holds {x.shape[1]} memory units; the "
            f"probe reads {len(probe.feature_mean)}: score it on the memory of the policy "
            "it was fitted on"
        )
    y = y[:, probe.dims]
    err, ref = probe.predict(x) - y, probe.mean - y
    steps = memory.episode.shape[1]
    episodes = [where[:, 0] == e for e in range(memory.episodes_per_trial)]
    by_episode = [_r2(err[e], ref[e]) for e in episodes]
    by_step = [_r2(err[where[:, 1] == t], ref[where[:, 1] == t]) for t in range(steps)]
    return ProbeScore(
        split=memory.split,
        r2=_r2(err, ref),
        by_episode=np.asarray(by_episode),
        by_step=np.asarray(by_step),
        error=_rmse(err),
        error_by_episode=np.stack([_rmse(err[e]) for e in episodes]),
        bias_by_episode=np.stack([_mean(err[e]) for e in episodes]),
        names=probe.names,
    )


def fit_and_score(
    evaluator: Evaluator,
    policy,
    fit: Sequence[ContextSet],
    score: Mapping[str, ContextSet],
    key: jax.Array,
    ridge: float = 1.0,
) -> dict[str, ProbeScore]:
    """{split: ProbeScore} of a probe fitted on recordings of the `fit` sets (contexts
    drawn from the training ranges) and scored on a recording of each set of `score`
    (held-out splits), the trials of the fit and of the scoring reset with keys
    apart: the probe the runner logs after each segment (`EvalConfig.probe`)."""
    k_fit, k_score = jax.random.split(key)
    fitted = fit_probe(
        [
            record_memory(evaluator, policy, s, jax.random.fold_in(k_fit, i))
            for i, s in enumerate(fit)
        ],
        ridge,
    )
    return {
        split: score_probe(fitted, record_memory(evaluator, policy, s, k_score))
        for split, s in score.items()
    }


def _values(env, contexts: ContextSet) -> np.ndarray:
    """[C, D]: each context of `contexts` as a Memory's targets hold it (flattened over
    the env's entries and their elements, in draw units)."""
    c = len(contexts)
    out = []
    for e in env.binding.entries:
        v = np.asarray(contexts.values[e.name], np.float32)
        v = v.reshape((c,) + v.shape[1:])
        if v.shape[1:] not in ((), e.draw_shape):  # as `Evaluator.ranges` takes them
            raise ValueError(
                f"context {e.name!r} of set {contexts.split!r}: values of shape {v.shape[1:]} "
                f"per context; give one number or one per element, shape {e.draw_shape}"
            )
        # one number per context for a per-element entry: every element of context i at
        # it (broadcasting [C] against [C, elements] lined it up with the elements, and a
        # set of as many contexts as elements steered context i to all contexts' values)
        v = v.reshape((c,) + (1,) * (len(e.draw_shape) - (v.ndim - 1)) + v.shape[1:])
        out.append(np.broadcast_to(v, (c,) + e.draw_shape).reshape(c, -1))
    return np.concatenate(out, axis=-1)


class SteeredCarry(struct.PyTreeNode):
    """A `SteeredPolicy`'s carry: the agent's, the rollout's step, and the size of the
    edit made in each env at each step so far (what `control_policy` replays)."""

    inner: Any  # the agent's carry
    step: jax.Array  # int32 []: the steps taken since `init_carry`
    sizes: jax.Array  # [T, N]: the norm of the edit made at step t in env i (0 not yet)

    @property
    def policy(self):
        """The core's state, as the agent's carry holds it (what `record_memory` records)."""
        return self.inner.policy


class SteeredPolicy(struct.PyTreeNode):
    """A recurrent `Policy` whose core state is edited at every step, after the core
    updates it and before the action head reads it (the edited state is also what
    it carries on): ``features += strength * edit``, where edit moves the features
    along `along`'s columns by what makes the probe's readout (``features @
    readout.T + offset``) equal `target`. A control (`control_policy`) instead
    moves them along `direction`, which the readout does not see, by the size
    `replay` gives for the step and env: a steered run's own edit sizes. The edited
    state is carried on, so a memory can grow without bound while the readout
    decodes `target`: check it with `record_memory`. Built by `steer_policy` and
    `control_policy`; used as a Policy by `Evaluator.evaluate` and `record_memory`
    (its envs are theirs, row for row)."""

    policy: Any
    readout: jax.Array  # [D', F]
    offset: jax.Array  # [D']
    along: jax.Array  # [F, D']: readout @ along = identity
    target: jax.Array  # [N, D']: what each env's memory is made to decode
    direction: jax.Array  # [F]: unit, readout @ direction = 0 (control only)
    strength: jax.Array  # []
    replay: jax.Array  # [T, N]: the control's edit size at step t in env i
    control: jax.Array  # [] bool (a leaf: steered and control runs share one program)

    # its rows are the envs of one batch: `Evaluator.evaluate` refuses to run it over a
    # set in chunks, whose chunk i would steer its context j to the target of context j
    rows_are_envs = True

    @property
    def agent(self):
        return self.policy.agent

    def init_carry(self, batch: int) -> SteeredCarry:
        steps = self.replay.shape[0]
        return SteeredCarry(
            self.policy.init_carry(batch), jnp.int32(0), jnp.zeros((steps, batch), jnp.float32)
        )

    def observe(self, carry: SteeredCarry, action, state) -> SteeredCarry:
        return carry.replace(inner=self.policy.observe(carry.inner, action, state))

    def delta(self, features: jax.Array, step=0) -> jax.Array:
        """[N, F] -> [N, F]: the edit made to the features at rollout step `step`."""
        missing = self.target - (features @ self.readout.T + self.offset)  # [N, D']
        size = self.replay[jnp.minimum(step, self.replay.shape[0] - 1)]  # [N]
        return jnp.where(
            self.control, size[:, None] * self.direction, self.strength * (missing @ self.along.T)
        )

    def edit(self, features: jax.Array, step=0) -> jax.Array:
        """[N, F] -> [N, F]: the features edited at rollout step `step`, as the head
        will read them."""
        return features + self.delta(features, step)

    def __call__(self, obs, carry: SteeredCarry, key=None):
        p, agent, inner = self.policy, self.policy.agent, carry.inner
        p._check_observation(obs)  # noqa: SLF001 - the Policy's own check
        tower, params = agent.towers()[0], p.params["policy"]

        def core(o, c):  # one env: the core's updated state, before the head
            actor_in, _ = agent.inputs(p.normalizer, o, c)
            x = tower.apply(params, actor_in, method="encode")
            return tower.apply(params, c.policy, x, c.reset, method="recur")[0]

        state = jax.vmap(core)(obs, inner)
        leaves, tree = jax.tree.flatten(state)
        sizes = np.cumsum([x.shape[-1] for x in leaves])[:-1]
        features = jnp.concatenate(leaves, -1)
        delta = self.delta(features, carry.step)
        state = jax.tree.unflatten(tree, jnp.split(features + delta, sizes, -1))

        # the head reads the core's output: a GRU's state, an LSTM's h (its last leaf)
        def act(h):  # one env's action, as `Agent.act` takes it
            return agent.head.postprocess(agent.head.mode(tower.apply(params, h, method="decode")))

        action = jax.vmap(act)(jax.tree.leaves(state)[-1])
        zero = jnp.zeros_like(inner.reset)
        t = jnp.minimum(carry.step, carry.sizes.shape[0] - 1)
        return action, SteeredCarry(
            inner.replace(policy=state, reset=zero, new_episode=zero),
            carry.step + 1,
            carry.sizes.at[t].set(jnp.linalg.norm(delta, axis=-1)),
        )


def steer_policy(
    evaluator: Evaluator,
    policy,
    probe: LinearProbe,
    to: ContextSet,
    *,
    along: str = "encoding",
    strength: float = 1.0,
) -> SteeredPolicy:
    """`policy` (deterministic, recurrent) with its memory steered, in the envs of
    `evaluator` running a set of ``len(to)`` contexts, so that the probe decodes
    context i of `to` in the envs of context i (the padding's envs: the last one).
    `along`: "encoding" moves the memory the way it moves with the context
    (`LinearProbe.encoding`), "readout" by the smallest change (in the readout's
    own directions)."""
    if along not in STEER_ALONG:
        raise ValueError(f"steer: along={along!r}; choose one of {list(STEER_ALONG)}")
    states = _memory_states(policy, "steer", "to steer; steer")
    if not policy.deterministic:
        raise ValueError("steer: give the deterministic policy (evaluation's)")
    if not np.isfinite(strength):
        raise ValueError(f"steer: strength must be a finite number, got {strength!r}")
    names = _dimension_names(evaluator.env)
    if tuple(names[i] for i in probe.dims if i < len(names)) != probe.names:
        raise ValueError(
            f"steer: the env's context dimensions are {list(names)}, not those the probe "
            f"was fitted on ({list(probe.names)}): fit it on a recording of this env"
        )
    entries = [e.name for e in evaluator.env.binding.entries]
    if sorted(to.values) != sorted(entries):
        raise ValueError(
            f"steer: the contexts to decode ({to.split!r}) give {sorted(to.values)}; give a "
            f"value to every name of the env's space and no other: {sorted(entries)}"
        )
    c = len(to)
    if c > evaluator.max_contexts:
        raise ValueError(
            f"steer: {c} contexts; the evaluator runs at most {evaluator.max_contexts} "
            "at once, and steering runs a set in one batch: split the set"
        )
    features = len(probe.feature_mean)
    if features != sum(x.shape[-1] for x in states):
        raise ValueError(
            f"steer: the probe reads {features} memory units; this agent's core has "
            f"{states[0].shape[-1]} per state: "
            "fit the probe on this policy's memory"
        )
    readout = (probe.weights / probe.feature_scale[:, None]).T  # [D', F]
    offset = probe.mean - probe.feature_mean @ readout.T
    target = _values(evaluator.env, to)[:, probe.dims]
    if not np.all(np.isfinite(target)):  # a NaN edit cut the episode and scored it 0
        bad = sorted({probe.names[j] for j in np.argwhere(~np.isfinite(target))[:, 1]})
        raise ValueError(f"steer: the contexts to decode ({to.split!r}) hold non-finite {bad}")
    target = target[np.minimum(np.arange(evaluator.max_contexts), c - 1)]
    if along == "readout":
        columns = np.linalg.pinv(readout)  # [F, D']: the smallest edit's map
    else:  # the encoding's directions, scaled so that the readout sees the change asked
        seen = readout @ probe.encoding.T  # [D', D']: what the readout sees of a unit move
        # relative to the two maps' sizes (a 1 x 1 `seen` has condition number 1 however
        # small: a readout at cosine 1e-9 to the encoding moved the memory 1e7 units per
        # unit of context)
        scale = np.linalg.norm(readout, 2) * np.linalg.norm(probe.encoding, 2)
        if np.linalg.svd(seen, compute_uv=False).min() <= 1e-4 * scale:
            raise ValueError(
                "steer: the probe's readout does not see the memory's encoding of "
                f"{list(probe.names)} (readout @ encoding = {seen.tolist()}): along="
                '"encoding" cannot make it decode a chosen context; use along="readout"'
            )
        columns = probe.encoding.T @ np.linalg.inv(seen)
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    steps, n = _rollout_shape(evaluator)
    return SteeredPolicy(
        policy=policy,
        readout=f32(readout),
        offset=f32(offset),
        along=f32(columns),
        target=f32(np.repeat(target, evaluator.trials, axis=0)),
        direction=jnp.zeros((features,), jnp.float32),
        strength=f32(strength),
        replay=jnp.zeros((steps, n), jnp.float32),
        control=jnp.asarray(False),
    )


def control_policy(
    evaluator: Evaluator,
    steered: SteeredPolicy,
    contexts: ContextSet,
    key: jax.Array,
    *,
    seed: int = 0,
) -> SteeredPolicy:
    """The size-matched control of `steered`: runs it on `contexts` with `key` (as
    `evaluator.evaluate` would), records the size of the edit it made in each env at
    each step, and returns the policy that makes edits of those sizes, in the same
    env at the same step, along one fixed unit direction (drawn from `seed`) that
    the probe's readout does not see. Evaluate it on the same contexts with the same
    key: a return it changes was changed by a push of the steered run's size, not
    by the decoded context. One compilation per env and batch size, shared with
    `record_memory` of a steered policy."""
    if not isinstance(steered, SteeredPolicy) or bool(steered.control):
        raise ValueError(
            "control_policy: give the steered policy (steer_policy's) whose edits to "
            f"replay, not {type(steered).__name__}"
            + (" built by control_policy" if isinstance(steered, SteeredPolicy) else "")
        )
    steps, n = _rollout_shape(evaluator)
    if steered.replay.shape != (steps, n):
        raise ValueError(
            f"control_policy: the steered policy was built for {steered.replay.shape[1]} "
            f"envs of {steered.replay.shape[0]} steps, this evaluator runs {n} of {steps}: "
            "build it with steer_policy on this evaluator"
        )
    ranges, _ = evaluator.ranges(contexts)
    sizes = _recorder(evaluator)(steered, ranges, key)[3].sizes
    readout = np.asarray(steered.readout, np.float64)
    direction = np.random.default_rng(seed).standard_normal(readout.shape[1])
    direction -= np.linalg.pinv(readout) @ (readout @ direction)  # out of the readout's rows
    return steered.replace(
        direction=jnp.asarray(direction / np.linalg.norm(direction), jnp.float32),
        # placed as steer_policy places its zeros: the recorder's output, laid out over
        # the evaluator's mesh, is another input type to jit, and the control's runs
        # compiled anew (2 programs, 10 s in experiments/steer_memory.py on 2 CPU cores)
        replay=jnp.asarray(np.asarray(sizes), jnp.float32),
        control=jnp.asarray(True),
    )


def steer(
    evaluator: Evaluator,
    policy,
    probe: LinearProbe,
    contexts: ContextSet,
    key: jax.Array,
    *,
    to: ContextSet | None = None,
    along: str = "encoding",
    strength: float = 1.0,
) -> EvalResult:
    """`evaluator.evaluate` of `policy` on `contexts` (at most ``max_contexts``) with
    its memory steered so that the probe decodes, in the envs of context i, context i
    of `to` (default `contexts`: the context each env runs); see `SteeredPolicy`.
    One compilation per evaluator and agent, whatever the sets, probe, strength and
    control (`control_policy`)."""
    to = contexts if to is None else to
    if len(to) != len(contexts):
        raise ValueError(
            f"steer: `to` holds {len(to)} contexts for the {len(contexts)} of "
            f"{contexts.split!r}: give one to decode per context run"
        )
    steered = steer_policy(evaluator, policy, probe, to, along=along, strength=strength)
    return evaluator.evaluate(steered, contexts, key)
