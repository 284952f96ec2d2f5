"""`check_env`: the contract every contextual env must keep.

Users run it on their own envs (a custom Brax `PipelineEnv` wrapped with
`make_contextual`, or their own `ContextualEnv`); the test suite runs it on
several Brax envs and backends.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from metarl.contexts import Choice, Fixed
from metarl.contexts.space import TaskParam
from metarl.envs.contextual import CONTEXT, TRIAL, ContextualEnv
from metarl.trees import to_numpy


class ContractError(AssertionError):
    """A contextual env broke its contract; the message says which clause."""


def _require(ok: bool, clause: str) -> None:
    if not ok:
        raise ContractError(clause)


def _obs_size(obs) -> object:
    if isinstance(obs, dict):
        return {k: v.shape[-1] for k, v in obs.items()}
    return obs.shape[-1]


def check_env(
    env: ContextualEnv, num_envs: int = 8, max_steps: int = 300, seed: int = 0
) -> dict[str, int]:
    """Checks jit, vmap, per-env contexts, resampling on trial end, determinism,
    finite observations and that every context reaches the simulation. Raises
    `ContractError` naming the broken clause; returns a few counts on success.

    `max_steps` random-action steps must end at least one trial (shorten the
    env's `episode_length` for envs that never terminate).
    """
    # One compiled reset serves every check: the env's own ranges and pinned ones
    # are pytrees of one structure, so passing them in compiles the reset once.
    reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))
    step = jax.vmap(env.step)
    keys = jax.random.split(jax.random.key(seed), num_envs)
    state = reset(keys, env.space)
    _check_reset(env, state, num_envs)

    # Roll out random actions; contexts hold within a trial and change at its end.
    def body(state, k):
        action = jax.random.uniform(k, (num_envs, env.action_size), minval=-1.0, maxval=1.0)
        nxt = step(state, action)
        out = (nxt.info[CONTEXT], nxt.info[TRIAL].new_trial, nxt.done, nxt.obs, nxt.reward)
        return nxt, (*out, _dynamics(nxt.pipeline_state))

    def rollout(state, key):
        return jax.lax.scan(body, state, jax.random.split(key, max_steps))

    rollout = jax.jit(rollout)
    k_run = jax.random.key(seed + 1)
    final, (ctx, new_trial, done, obs, *_) = rollout(state, k_run)
    _require(
        all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(obs)),
        "step produced non-finite observations (the env must cut and report non-finite states)",
    )
    new_trial = np.asarray(new_trial) > 0
    _require(
        new_trial.any(),
        f"no trial ended within {max_steps} random steps; pass a larger max_steps or a "
        "shorter episode_length",
    )
    _check_resampling(env, state.info[CONTEXT], ctx, new_trial)

    # Determinism: the same keys give bit-identical states.
    again, _ = rollout(reset(keys, env.space), k_run)
    same = jax.tree.map(
        lambda a, b: bool(np.array_equal(a, b, equal_nan=True)),
        to_numpy(final),
        to_numpy(again),
    )
    _require(
        all(jax.tree.leaves(same)),
        "two runs from the same key differ: the env is not deterministic",
    )
    reached = _check_contexts_reach_the_simulation(env, reset, keys, lambda s: rollout(s, k_run))
    return {
        "steps": max_steps * num_envs,
        "episodes_ended": int(np.asarray(done).sum()),
        "trials_ended": int(new_trial.sum()),
        "contexts_reaching": reached,
    }


def _check_contexts_reach_the_simulation(env: ContextualEnv, reset, keys, rollout) -> int:
    """Every context that varies changes what the env does: with every name pinned
    to one draw, then one name moved to the draw farthest from it (the same reset
    keys and actions, the same compiled rollout), the dynamical state (`_dynamics`)
    at some step, the rewards, or the env's own observations differ; for a physical
    context (not a task parameter) only observations that a step computed count,
    not those an auto-reset returned: an env whose reset reads the context but
    whose step simulates a model it cached must not pass. Returns the number of
    names checked."""
    draws = {}
    for i, (name, dist) in enumerate(env.space.items()):
        if isinstance(dist, Fixed):
            continue
        k = jax.random.split(jax.random.fold_in(jax.random.key(0), i), 32)
        draws[name] = np.asarray(jax.vmap(lambda k, d=dist: d.sample(k, ()))(k), np.float32)
    base = env.space.pinned({name: d[0] for name, d in draws.items()})

    task = {e.name for e in env.binding.entries if isinstance(e.target, TaskParam)}

    def trajectory(ranges, physical):
        _, (_, _, done, obs, reward, dynamics) = rollout(reset(keys, ranges))
        obs = env._base(obs)  # noqa: SLF001 - the env's own observation, without the context
        if physical:  # [T, B, ...]: the observations of steps that did not reset
            stepped = ~np.asarray(done, bool)
            obs = jax.tree.map(lambda x: np.asarray(x)[stepped], obs)
        return [np.asarray(x) for x in jax.tree.leaves((dynamics, obs, reward))]

    reference = {physical: trajectory(base, physical) for physical in (False, True)}
    for name, d in draws.items():
        far = np.where(np.abs(d.min(0) - d[0]) >= np.abs(d.max(0) - d[0]), d.min(0), d.max(0))
        if np.array_equal(far, d[0]):  # a degenerate range: nothing to move
            continue
        physical = name not in task
        moved = trajectory(base.pinned({name: far}), physical)
        _require(
            any(
                not np.array_equal(a, b, equal_nan=True)
                for a, b in zip(reference[physical], moved, strict=True)
            ),
            f"context {name!r} changes nothing: pinned to {d[0].tolist()} and to "
            f"{far.tolist()}, the same keys and actions gave the same physics, observations "
            "and rewards; it does not reach the simulation (a System the env caches, a field "
            "the backend does not read, a task parameter the env never uses)",
        )
    return len(draws)


def _dynamics(pipeline_state) -> tuple:
    """What the next step evolves: MJX's qpos, qvel, act and mocap poses, Brax's q,
    qd, x, xd (the positional and spring backends integrate x). Not the quantities
    derived from them and the model (inertias in world frame, a static body's
    subtree, a contact's friction): those change with contexts that move nothing,
    such as the mass of a body welded to the world or the friction of a contact
    whose condim is 1, and such contexts must not pass."""
    if hasattr(pipeline_state, "qpos"):  # mjx.Data, Brax's mjx State
        fields = ("qpos", "qvel", "act", "mocap_pos", "mocap_quat")
    elif hasattr(pipeline_state, "q"):
        fields = ("q", "qd", "x", "xd")
    else:
        return (pipeline_state,)
    return tuple(getattr(pipeline_state, f) for f in fields if hasattr(pipeline_state, f))


def _check_reset(env: ContextualEnv, state, num_envs: int) -> None:
    """Structure (info keys, observation size, finite values) and per-env contexts."""
    names = list(env.space)
    _require(
        sorted(state.info[CONTEXT]) == sorted(names),
        f"state.info[{CONTEXT!r}] must hold exactly the space's names {names}, "
        f"got {sorted(state.info[CONTEXT])}",
    )
    _require(
        _obs_size(state.obs) == env.observation_size,
        f"observation size {_obs_size(state.obs)} differs from env.observation_size "
        f"{env.observation_size}",
    )
    _require(
        all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(state.obs)),
        "reset produced non-finite observations",
    )
    for name in names:  # contexts differ across envs, where a draw per env would tell
        if _p_all_equal(env, name, num_envs) > _CHANCE:
            continue
        values = np.asarray(state.info[CONTEXT][name]).reshape(num_envs, -1)
        _require(
            len({v.tobytes() for v in values}) > 1,
            f"context {name!r} is identical in all {num_envs} envs after reset: contexts must "
            "be drawn per env",
        )


# A clause that a valid env breaks with at most this probability is checked; one that
# it could break by chance (a Choice of two values drawn equal in every env) is not.
_CHANCE = 1e-6


def _p_all_equal(env: ContextualEnv, name: str, n: int) -> float:
    """The probability that `n` independent draws of context `name` are all equal:
    1 for a range that has one value, 0 for a continuous one, and for a Choice
    sum_i p_i^n per element (drawn independently per element)."""
    dist = env.space[name]
    low, high = dist.support()
    if np.all(np.asarray(low) == np.asarray(high)):  # Fixed, or a range pinned to a point
        return 1.0
    if not isinstance(dist, Choice):
        return 0.0
    p = np.asarray(dist.probs, np.float64)
    elements = int(np.prod(env.binding.entries[list(env.space).index(name)].draw_shape))
    return float(np.sum(p**n) ** (elements if dist.per_element else 1))


def _check_resampling(env: ContextualEnv, first, ctx, new_trial: np.ndarray) -> None:
    """Contexts hold within a trial and are redrawn at trial ends ([T, B] rollout)."""
    steps = new_trial.shape[0]
    for n in env.space:
        before = np.concatenate([np.asarray(first[n])[None], np.asarray(ctx[n])[:-1]])
        after = np.asarray(ctx[n])
        same = np.all((after == before).reshape(steps, new_trial.shape[1], -1), axis=-1)
        _require(
            bool(np.all(same[~new_trial])),
            f"context {n!r} changed in the middle of a trial: it must stay fixed until the "
            "trial ends",
        )
        if _p_all_equal(env, n, 2) ** int(new_trial.sum()) <= _CHANCE:
            _require(
                bool(np.any(~same[new_trial])),
                f"context {n!r} was never resampled over {int(new_trial.sum())} trial ends",
            )
