"""`check_env`: the contract every contextual env must keep.

Users run it on their own envs (a custom Brax `PipelineEnv` wrapped with
`make_contextual`, or their own `ContextualEnv`); the test suite runs it on
several Brax envs and backends.
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np

from metarl.contexts import Choice, Fixed
from metarl.contexts.paths import RawPath
from metarl.contexts.quantities import Quantity
from metarl.contexts.space import TaskParam
from metarl.envs.contextual import CONTEXT, DERIVED, TRIAL, ContextualEnv
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
    finite observations and that every context reaches the simulation (a
    physical one through the step, not only the reset). Raises
    `ContractError` naming the broken clause (every context that does not reach the
    simulation, and why, in one message); returns a few counts on success.

    `max_steps` random-action steps must end at least one trial (shorten the
    env's `episode_length` for envs that never terminate). `num_envs` >= 2: the
    contexts drawn per env are compared across them.
    """
    for name, value, least in (("num_envs", num_envs, 2), ("max_steps", max_steps, 1)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < least:
            why = " (contexts drawn per env are compared across envs)" if least == 2 else ""
            raise ValueError(f"check_env: {name} must be an integer >= {least}{why}, got {value!r}")
    # One compiled reset serves every check: the env's own ranges and pinned ones
    # are pytrees of one structure, so passing them in compiles the reset once.
    reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))
    step = jax.vmap(env.step)
    k_reset, k_run = jax.random.split(jax.random.key(seed))  # seed+1's keys stay apart
    keys = jax.random.split(k_reset, num_envs)
    state = reset(keys, env.space)
    _check_reset(env, state, num_envs)

    # Roll out random actions; contexts hold within a trial and change at its end.
    # Each step also steps a shadow of the batch, the same states with one context
    # `moved` (`_shadow`; none moved outside `_check_contexts_reach_the_simulation`),
    # in the same vmapped call: one compiled step serves both.
    halves = (slice(0, num_envs), slice(num_envs, None))
    ngeom = int(getattr(env.binding.sys, "ngeom", 0))

    def body(state, k, moved):
        if env.discrete_actions:  # an action index per env
            action = jax.random.randint(k, (num_envs,), 0, env.action_size)
        else:
            action = jax.random.uniform(k, (num_envs, env.action_size), minval=-1.0, maxval=1.0)
        moved_context = _shadow(state.info[CONTEXT], moved)
        derived = jax.vmap(env.binding.derive, axis_size=num_envs)(moved_context)
        shadow = state.replace(info={**state.info, CONTEXT: moved_context, DERIVED: derived})
        both = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), state, shadow)
        both = step(both, jnp.concatenate([action, action]))
        nxt, after = (jax.tree.map(lambda x, h=h: x[h], both) for h in halves)
        out = (nxt.info[CONTEXT], nxt.info[TRIAL].new_trial, nxt.done, nxt.obs, nxt.reward)
        touching = _touching(after.pipeline_state, ngeom)
        return nxt, (*out, _dynamics(nxt.pipeline_state), touching, _stepped(env, after))

    def rollout(state, key, moved):
        return jax.lax.scan(lambda s, k: body(s, k, moved), state, jax.random.split(key, max_steps))

    rollout = jax.jit(rollout)
    unmoved = _moved(env)
    final, (ctx, new_trial, done, obs, *_) = rollout(state, k_run, unmoved)
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
    again, _ = rollout(reset(keys, env.space), k_run, unmoved)
    same = jax.tree.map(
        lambda a, b: bool(np.array_equal(a, b, equal_nan=True)),
        to_numpy(final),
        to_numpy(again),
    )
    _require(
        all(jax.tree.leaves(same)),
        "two runs from the same key differ: the env is not deterministic",
    )
    reached = _check_contexts_reach_the_simulation(
        env, lambda ranges, moved: rollout(reset(keys, ranges), k_run, moved)[1]
    )
    return {
        "steps": max_steps * num_envs,
        "episodes_ended": int(np.asarray(done).sum()),
        "trials_ended": int(new_trial.sum()),
        "contexts_reaching": reached,
    }


def _moved(env: ContextualEnv, name: str | None = None, value=None) -> dict[str, np.ndarray]:
    """The shadow's context: {name: float32[draw_shape]} for every entry, `value`
    (in draw units) for context `name` and NaN (not moved: a draw is never NaN) for
    the others; one structure for any move, so the rollout compiles once."""
    return {
        e.name: np.broadcast_to(
            np.asarray(value if e.name == name else np.nan, np.float32), e.draw_shape
        )
        for e in env.binding.entries
    }


def _shadow(context: dict, moved: dict) -> dict:
    """`context` ([B, ...] per name) with the moved name's value swapped in."""
    return {n: jnp.where(jnp.isnan(moved[n]), c, moved[n]) for n, c in context.items()}


def _stepped(env: ContextualEnv, state) -> tuple:
    """What a step computed: whether it ended the episode, then the dynamical
    state (a reset's where it ended), the step's own observation (before any
    auto-reset, without the context) and its reward."""
    obs = env._base(state.info[TRIAL].final_obs)  # noqa: SLF001
    return state.done > 0, _dynamics(state.pipeline_state), obs, state.reward


def _check_contexts_reach_the_simulation(env: ContextualEnv, run) -> int:
    """Every context that varies changes what the env does. With every name pinned
    to one draw and one name moved to the draw farthest from it:

    - a task parameter (its effect may be only in the reset: a goal drawn there)
      changes the dynamical state (`_dynamics`) at some step, the rewards or the
      env's own observations of a whole rollout (the same reset keys and actions);
    - a physical context changes what a step computes: every state of the rollout
      in the pinned context is stepped once more with the same action and the name
      moved (in `state.info[CONTEXT]`, with what `Binding.derive` derives from it in
      `state.info[DERIVED]`: from those two the step rebuilds the System), and
      the dynamical state where neither step ended an episode, or its end, must
      differ from that same shadow step without the move (its observation or reward
      alone is refused by a message of its own: a quantity the env derives from the
      model and observes, which the simulation ignores). An env whose reset reads the context
      (to settle the robot, to observe it) but whose step simulates a model it
      cached must not pass.

    `run(ranges, moved)` returns check_env's rollout outputs ([T, B] per leaf;
    the last is `_stepped` of the shadow batch); one compiled rollout serves every
    name, as ranges and the move are traced arguments. Returns the number of names
    checked."""
    draws = {}
    for i, (name, dist) in enumerate(env.space.items()):
        if isinstance(dist, Fixed):
            continue
        k = jax.random.split(jax.random.fold_in(jax.random.key(0), i), 32)
        # the parameters' shape (per-element bounds: one value per element): what
        # `pinned` takes back
        shape = np.shape(dist.support()[0])
        draws[name] = np.asarray(jax.vmap(lambda k, d=dist, s=shape: d.sample(k, s))(k), np.float32)
    if not draws:
        return 0
    base = env.space.pinned({name: d[0] for name, d in draws.items()})
    task = {e.name for e in env.binding.entries if isinstance(e.target, TaskParam)}
    # the geoms through whose contacts each contact context acts
    contact = {
        e.name: g for e in env.binding.entries if (g := _geoms(e, env.binding.sys)) is not None
    }

    def trajectory(outputs) -> list[np.ndarray]:
        *_, obs, reward, dynamics, _, _ = outputs
        obs = env._base(obs)  # noqa: SLF001 - the env's own observation, without the context
        return [np.asarray(x) for x in jax.tree.leaves((dynamics, obs, reward))]

    def differ(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
        return any(not np.array_equal(x, y, equal_nan=True) for x, y in zip(a, b, strict=True))

    reference = run(base, _moved(env))
    failures: list[str] = []  # each name that does not reach the simulation, and why
    ended0, dynamics0, *rest0 = to_numpy(reference[-1])
    touching = to_numpy(reference[-2])  # [T, B, ngeom], None: a backend keeps no contacts
    for name, d in draws.items():
        far = np.where(np.abs(d.min(0) - d[0]) >= np.abs(d.max(0) - d[0]), d.min(0), d.max(0))
        if np.array_equal(far, d[0]):  # a degenerate range: nothing to move
            continue
        values = f"at {d[0].tolist()} and at {far.tolist()}"
        if name in task:  # the whole rollout: a task parameter may act in the reset only
            if not differ(
                trajectory(reference), trajectory(run(base.pinned({name: far}), _moved(env)))
            ):
                failures.append(
                    f"context {name!r} changes nothing: {values}, the same keys and actions "
                    "gave the same physics, observations and rewards; the env never uses this "
                    "task parameter"
                )
            continue
        ended, dynamics, *rest = to_numpy(run(base, _moved(env, name, far))[-1])
        simulated = ~(ended | ended0)  # [T, B]: a step that ended returns a reset's physics
        if not np.array_equal(ended, ended0) or differ(
            [x[simulated] for x in jax.tree.leaves(dynamics0)],
            [x[simulated] for x in jax.tree.leaves(dynamics)],
        ):
            continue
        # the same motion: a change in the step's observation or reward alone is the env
        # reading a quantity derived from the model (a welded body's mass in the centre
        # of mass it observes), not a context the physics simulates (until 2026-12-07
        # that passed)
        observed = differ(jax.tree.leaves(rest0), jax.tree.leaves(rest))
        seen = ""
        if name in contact and touching is not None:  # were there contacts to act on?
            touched = int(touching[simulated][:, contact[name]].any(axis=-1).sum())
            if not touched:
                failures.append(
                    f"context {name!r} was never exercised: it acts only through contacts, and "
                    f"in none of the {int(simulated.sum())} states stepped was a contact of its "
                    "geoms active (in a step's last physics substep); check it on a rollout "
                    "that makes contact (more max_steps or num_envs, or other ranges for the "
                    "other contexts)"
                )
                continue
            seen = f" ({touched} of them with a contact of its geoms active)"
        if observed:
            failures.append(
                f"context {name!r} changes only what the env observes or rewards, not the "
                f"motion: {values}, one step from the same {ended.size} states{seen} with the "
                "same actions gave the same physics (qpos, qvel, act, mocap; Brax's q, qd, x, "
                "xd) and ends; the env reads a quantity derived from it (a welded body's mass "
                "in a centre of mass, an inertia in world frame) that the simulation ignores"
            )
            continue
        failures.append(
            f"context {name!r} changes nothing a step simulates: {values}, one step from the "
            f"same {ended.size} states{seen} with the same actions gave the same physics, "
            "observations, rewards and ends; the step ignores it (a System the env caches, "
            "a field the backend does not read), whatever its reset does"
        )
    if len(failures) > 1:  # every one at once: each check_env compiles a rollout anew
        checked = ", ".join(map(repr, draws))
        head = f"{len(failures)} of the {len(draws)} contexts checked ({checked}) do not reach"
        failures = [f"{head} the simulation:", *failures]
    _require(not failures, "\n- ".join(failures))
    return len(draws)


# Raw paths to contact parameters: they act only where a contact is active.
_CONTACT_FIELDS = ("geom_friction", "geom_sol", "geom_margin", "geom_gap", "pair_", "elasticity")


def _geoms(entry, sys) -> np.ndarray | None:
    """The geoms whose contacts a context acting only through contacts (a friction,
    a restitution) reaches the physics by; None for any other context."""
    target = entry.target
    if isinstance(target, Quantity) and target.through_contacts:
        elements, chosen = target.elements, entry.select
    elif isinstance(target, RawPath) and target.field.startswith(_CONTACT_FIELDS):
        elements = "pairs" if target.field.startswith("pair_") else "geoms"
        chosen = target.index[0] if target.index else None
    else:
        return None
    count = np.asarray(sys.pair_geom1).shape[0] if elements == "pairs" else int(sys.ngeom)
    chosen = np.arange(count)[slice(None) if chosen is None else chosen]
    if elements == "pairs":  # a pair's contact is one of its two geoms'
        chosen = np.concatenate(
            [np.asarray(sys.pair_geom1)[chosen], np.asarray(sys.pair_geom2)[chosen]]
        )
    return np.unique(np.ravel(chosen))


def _touching(pipeline_state, ngeom: int) -> jax.Array | None:
    """[B, ngeom]: whether some active contact (MuJoCo's dist < includemargin) holds
    each geom in each env's physics at the end of a step; None where the state keeps
    no contacts (Brax's generalized, positional and spring pipelines)."""
    contact = getattr(getattr(pipeline_state, "_impl", None), "contact", None)
    if contact is None or not hasattr(contact, "dist"):
        return None
    active = contact.dist - contact.includemargin < 0  # [B, ncon]

    def per_geom(active, geom):  # one env: [ncon], [ncon, 2] -> [ngeom]
        hit = jnp.zeros(ngeom, bool)
        return hit.at[geom[:, 0]].max(active).at[geom[:, 1]].max(active)

    return jax.vmap(per_geom)(active, contact.geom)


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
