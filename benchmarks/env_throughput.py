"""Env throughput: plain Brax vs Brax domain randomization vs make_contextual.

All variants run in one process, compiled first (after an untimed warm-up
compile: `_warm_up`), then timed in paired rounds
(each round runs every variant once, in turn, round r starting with the r-th
variant since 2026-11-28; before, plain Brax always ran first), so that the ratios compare
runs made under the same machine load. A variant's steps/s is over the geometric
mean of its rounds' times and its ratio the geometric mean of the paired rounds'
ratios (the same number: since 2026-12-05; before, the ratio column was the
median paired ratio, which disagreed with the steps/s columns). Each variant rolls
out random actions for `steps` steps on `num_envs` envs inside one jitted `lax.scan`; the envs'
first reset is a program of its own, run before each timed call and not timed
(since 2026-11-27 (GPU); before, every variant's rounds timed it too).

* plain: `brax.envs.training.wrap(env)` (vmap + episode + cached auto-reset).
* brax_dr: the same with `randomization_fn`: a static batch of Systems with
  gravity, per-body mass and per-geom friction drawn once, at build time.
* brax_dr_same, brax_dr_every, brax_dr_every_same: diagnostics of why Brax DR outran
  plain Brax on MJX's ant on a GPU: its fields batched but left at the env's values
  (what the draw changes), every array of the System batched (none of it a constant of
  the program), both.
* brax_dr_metarl: Brax's DR with the Systems metarl's contexts make (`_metarl_randomizer`:
  one context per env drawn once, written as the contextual env writes it, the mass's
  inertia and the solver's inverse weights with it): the contextual env without its
  resampling and exact resets.
* contextual: `make_contextual` with the same quantities, drawn afresh at every
  episode inside jit, with exact resets (`--strategy`, default auto); friction
  only where some geom collides (not on inverted_pendulum, where no contact
  reads it). Where the strategy is the stock ("auto" on a GPU),
  it is stepped as PPO steps it (contextual_stock below).
* contextual_<strategy>: the same with one reset strategy forced
  (dense, loop, compact, pool). For pool, refills/step is the fraction of
  steps at which the pool was refilled (a dense refill costs one dense step).
* contextual_pool_dense: pool refilled by the dense strategy on any platform
  (what "pool" runs on a GPU), to measure that path on a CPU.
* contextual_firstorder, contextual_perstep: "auto" with the constraint solver's
  inverse weights left first-order (no `Binding.derive`, as before 2026-11-26), or
  recomputed at every rebuild of the System (every step) instead of once per drawn
  context: what exact weights cost, and what carrying them saves.
* contextual_stock: the pool as metarl's PPO steps it: every env stocked with
  `--stock-depth` fresh states (PPO: `PPOConfig.stock_depth`), the steps run in blocks
  of `--stock-block` (PPO: `unroll_length`), each after `refill_stocks`: a refill in
  bulk where some env holds fewer fresh states than a block may take
  (`ContextualEnv.stock`, `refill`); the steps never reset and never ask whether to.
  The stock starts empty: its first fill (`--stock-depth` resets per env, which PPO
  pays once a run, in `init_env_state`) is part of the untimed first reset; each
  round ends with a refill of every entry it used. `contextual_stock:D` runs a stock
  of D (to compare depths in one run); fresh/step counts the fresh states the
  refills computed (whole chunks of num_envs), dones/step those the steps took.
* contextual_pool_cond: the pool deciding whether to refill with `lax.cond`
  instead of a loop of 0 or 1 trips (on a GPU, a loop's predicate is read by the
  host at every step; a conditional may run inside a CUDA graph).
* ablate_noreset, ablate_norebuild: diagnostics, not exact: contextual dense with
  done envs never reset, or with the step run on the default System.
* Every variant's compiled program is counted for loops and conditionals (each
  waits on the host on a GPU) and read for the most numbers one of its loops carries
  from trip to trip (`metarl.compilation.loop_carries`: more than plain Brax's means
  state kept alive that nothing reads); `--dump-hlo DIR` keeps the programs' HLO text.
* `--profile`: one more rollout per variant under `jax.profiler` (`--profile-rounds
  K`: K of them in paired rounds, each figure their median), every operation summed
  per batched step and split by how often it runs: in the physics
  substeps (more than once a step), once a step or less (the step's own work, the
  resets), once; and again by stage (`STAGES`: MJX's named stages of a physics
  step, metarl's resets, the rest), each operation by the innermost named scope
  its instruction records; with how many operations ran per batched step (on a GPU, the
  kernels and copies launched: `gpu_program.py` counts them from the program alone).
  On a CPU the operations XLA's CPU runtime ran (summed over its
  threads); on a GPU the kernels on the device's streams, by HLO operation (GPU
  time; the host's waits between kernels are not in it). `--trace-dir DIR` keeps
  each variant's raw trace, the first round's (`DIR/<env>_<num_envs>_<variant>/`, for TensorBoard's
  profile plugin, Perfetto or `jax.profiler.ProfileData`).
* `--summarize FILE ...` times nothing: it prints the ratios of stored result files
  again, aggregated as above, beside the medians files before 2026-12-05 reported.
* Each ratio comes with a 95% confidence interval: the t interval of the paired rounds'
  log ratios (since 2026-12-06), which says whether it differs from a target by more
  than the rounds disagree. Rounds of one process share its host's drift, so read it as
  a lower bound on the uncertainty across runs.
* ablate_norefill: the pool's machinery without its refills (not exact): a done
  env swaps in its pool entry, which is never recomputed, so the step carries and
  selects the second physics state but never refills and never asks whether to
  (no 0-or-1-trip loop, which on a GPU waits on the host at every step). With
  `contextual_pool`, `contextual_dense` and `ablate_noreset` it splits the pool's
  cost: carrying the entry (noreset - norefill), its refills (refills/step x
  (noreset - dense)) and the rest, the per-step check (norefill - pool - refills).

With several `--num-envs` it also writes `--out`.json and a PNG plot of
steps/s against num_envs (log-log) for plain, brax_dr and contextual. The JSON
records the settings (steps, rounds, strategy, reset_chunk, backend, variants),
`metarl.provenance.software()` and `metarl.provenance.platform()` (XLA_FLAGS,
JAX's numerical settings, device kind and count, on a CPU the host CPU).

    python benchmarks/env_throughput.py --envs hopper inverted_pendulum --num-envs 1024
    python benchmarks/env_throughput.py --envs hopper ant --num-envs 1024 4096 16384 65536
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import tyro
from _cli import check_counts, check_envs, paired_ratio
from brax import envs as brax_envs
from brax.envs.wrappers import training as brax_training

from metarl import contexts as C
from metarl import provenance
from metarl.compilation import loop_carries
from metarl.contexts.quantities import QUANTITIES
from metarl.envs import (
    POOL,
    RESET_STRATEGIES,
    ContextualEnv,
    ResetPool,
    make_contextual,
    refill_stocks,
)
from metarl.envs.autoreset import pooled_where_done

GRAVITY = (0.7, 1.3)
MASS = (0.7, 1.3)
FRICTION = (0.5, 1.5)
MAIN = ("plain", "brax_dr", "contextual")


@dataclasses.dataclass(frozen=True)
class Config:
    envs: tuple[str, ...] = ("hopper", "inverted_pendulum")
    num_envs: tuple[int, ...] = (1024,)
    steps: int = 200
    rounds: int = 7
    backend: str | None = None  # None: each env's default backend
    reset_chunk: float = 0.0625
    strategy: str = "auto"  # reset strategy of the "contextual" variant
    stock_depth: int = 32  # the stock's fresh states per env (PPO: `PPOConfig.stock_depth`)
    stock_block: int = 16  # the steps between two chances to refill (PPO: unroll_length)
    variants: tuple[str, ...] = MAIN
    out: str | None = None  # path stem for the .json / .png results
    dump_hlo: str | None = None  # a folder for each variant's compiled program (.hlo.gz)
    profile: bool = False  # time every operation of one more rollout per variant
    profile_rounds: int = 1  # --profile: traces per variant, in paired rounds (medians)
    trace_dir: str | None = None  # --profile: keep each variant's raw trace here
    # result files to read instead of timing anything: every run's ratios again, as
    # this script now aggregates them (files written before 2026-12-05 printed medians)
    summarize: tuple[str, ...] = ()

    def __post_init__(self):
        check_counts(self)
        check_envs(self)
        if unknown := [v for v in self.variants if not _known_variant(v)]:
            raise ValueError(f"--variants: unknown {unknown}; choose among {', '.join(VARIANTS)}")
        depths = [self.stock_depth] + [
            int(v.partition(":")[2]) for v in self.variants if v.startswith("contextual_stock:")
        ]
        if not 1 <= self.stock_block <= min(depths):
            raise ValueError(
                f"--stock-block {self.stock_block}: the steps between refills must be at least "
                f"1 and at most the stock's depth ({min(depths)}), or an env could find its "
                "stock empty"
            )


def _space(sys, backend: str) -> C.ContextSpace:
    """Gravity, per-body mass and, where some geom collides, per-geom friction (every
    geom of inverted_pendulum has contype 0: its friction would change nothing, and
    metarl refuses it)."""
    entries = {"gravity": C.Scale(*GRAVITY), "mass": C.Scale(*MASS, per_element=True)}
    if QUANTITIES["friction"].live(sys, backend).any():
        entries["friction"] = C.Scale(*FRICTION, per_element=True)
    return C.ContextSpace(entries)


def _brax_randomizer(num_envs: int, drawn: bool = True, every_field: bool = False):
    """Brax's `randomization_fn`: gravity, per-body mass and per-geom friction drawn per
    env, written as a Brax user writes them: the mass into `body_mass` and
    `link.inertia.mass` alone, friction into every geom. metarl's `mass` also scales
    each body's inertia tensor with it and recomputes the solver's inverse weights
    (`metarl.contexts.quantities`): a context batches more fields than this DR, whose
    step keeps those as constants of the program, so DR is the cheaper side.
    `drawn=False`: those fields batched but left at the env's values; `every_field`:
    every array of the System batched (one copy per env), none of it a constant of the
    program."""

    def randomize(sys):
        keys = jax.random.split(jax.random.PRNGKey(7), 3)
        (g0, g1), (m0, m1), (f0, f1) = (GRAVITY, MASS, FRICTION) if drawn else ((1.0, 1.0),) * 3
        g = jax.random.uniform(keys[0], (num_envs,), minval=g0, maxval=g1)
        m = jax.random.uniform(keys[1], (num_envs, sys.num_links()), minval=m0, maxval=m1)
        f = jax.random.uniform(keys[2], (num_envs, sys.ngeom), minval=f0, maxval=f1)
        fields = {
            "gravity": sys.gravity * g[:, None],
            "opt.gravity": sys.opt.gravity * g[:, None],
            "link.inertia.mass": sys.link.inertia.mass * m,
            "body_mass": jax.vmap(lambda m: sys.body_mass.at[1:].multiply(m))(m),
            "geom_friction": jax.vmap(lambda f: sys.geom_friction.at[:, 0].multiply(f))(f),
        }
        if every_field:
            copies = jax.tree.map(lambda x: jnp.broadcast_to(x, (num_envs,) + jnp.shape(x)), sys)
            return copies.tree_replace(fields), jax.tree.map(lambda _: 0, sys)
        batched = sys.tree_replace(fields)
        axes = jax.tree.map(lambda _: None, sys).tree_replace({k: 0 for k in fields})
        return batched, axes

    return randomize


def _metarl_randomizer(binding: C.Binding, num_envs: int):
    """Brax's `randomization_fn` with the Systems metarl's contexts make: one context per
    env drawn from `binding`'s ranges, once, at build time, and written into the System as
    the contextual env writes it at every step (`Binding.apply`, the derived constants
    with it); the arrays whose values differ between envs batched, every other array the
    System the contextual env steps with its contexts unbatched. The contextual env with
    its resampling and exact resets taken away: against it, what the mechanism costs;
    against `brax_dr`, what the physics metarl writes (the mass's inertia and inverse
    weights) costs."""

    def randomize(sys):
        # the System Brax's wrapper randomizes is the one the binding was made from
        if [np.shape(x) for x in jax.tree.leaves(sys)] != [
            np.shape(x) for x in jax.tree.leaves(binding.sys)
        ]:
            raise ValueError("brax_dr_metarl: the env's System is not the one metarl binds")
        keys = jax.random.split(jax.random.PRNGKey(7), num_envs)

        def one(key):
            context = binding.sample(key)
            return binding.apply(context, binding.derive(context))

        systems = jax.vmap(one)(keys)
        leaves, treedef = jax.tree.flatten(systems)
        varies = [bool(np.any(x != x[:1])) for x in map(np.asarray, leaves)]
        batched = [x if v else x[0] for x, v in zip(leaves, varies)]
        axes = [0 if v else None for v in varies]
        return treedef.unflatten(batched), treedef.unflatten(axes)

    return randomize


# diagnostics: Brax's DR with its fields left at the env's values, or with every field
# of the System batched
_DR = {
    "brax_dr": {},
    "brax_dr_same": {"drawn": False},
    "brax_dr_every": {"every_field": True},
    "brax_dr_every_same": {"drawn": False, "every_field": True},
}


def _refilled(state, nxt) -> jax.Array:
    """Whether a "pool" step refilled: some env was done whose entry was not ready
    (the condition `pooled_where_done` refills on)."""
    if not isinstance(state.info.get(POOL), ResetPool):  # none, or a stock (refilled per block)
        return jnp.int32(0)
    return jnp.any((nxt.done > 0) & ~state.info[POOL].ready).astype(jnp.int32)


class _Rollout(NamedTuple):
    """A variant's two programs: `start(key)` -> the envs' first states (for the stock,
    filled), outside the timed call; `run(key, state)` -> the timed steps' sums."""

    start: Any
    run: Any


def _rollout(reset, step, action_size: int, num_envs: int, steps: int, stocked=None):
    """-> `_Rollout`, whose `run` returns ((done envs, refills, fresh states computed by
    the stock's refills, the sum of every observation and reward), summed over steps;
    the last state).
    The sum is returned so that XLA computes what a learner reads: with only the
    counts returned, it dropped part of the observation and reward work, more of it
    for some variants than for others. The first reset is `start`'s, untimed: a
    stock starts empty, and its first fill (`depth` resets per env, once per PPO run)
    would otherwise count in every round. With `stocked` = (env, block) (contextual_stock), the
    steps run in blocks of `block` steps, each after `refill_stocks` (a refill where some
    env holds fewer than `block` fresh states), as PPO's rollout runs them; the round ends
    with a refill of every entry it used, so that it computes every reset its steps took
    (until 2026-11-28 (audit) a round left out 1/blocks of its resets; until 2026-12-04
    every block refilled, the stock as deep as a block).
    `run` takes its state donated and returns the last one, as PPO's
    training loop and any loop that steps on from it do. Until 2026-11-27 (donated)
    it returned the sums alone: XLA then copied the state passed in before stepping
    it (for the stock of ant on MJX at 1024 envs, 195 MB a call), and dropped from
    every loop the fields of the physics state that no later step reads (the most a
    loop of plain Brax's ant on MJX carried: 0.40M numbers then, 6.19M now)."""

    def body(state, k):
        action = jax.random.uniform(k, (num_envs, action_size), minval=-1.0, maxval=1.0)
        nxt = step(state, action)
        read = sum(jnp.sum(x) for x in jax.tree.leaves((nxt.obs, nxt.reward)))
        return nxt, (nxt.done.sum(), _refilled(state, nxt), read)

    def refilled(refill, state):  # -> (state, refills, fresh states computed)
        held = lambda s: jnp.sum(jax.vmap(stocked[0].stock_left)(s))  # noqa: E731
        new = refill(state)
        fresh = held(new) - held(state)  # computed in chunks of num_envs (`stock_refill`)
        return new, (fresh > 0).astype(jnp.int32), -(-fresh // num_envs) * num_envs

    def full(state):  # every used entry computed
        return refilled(jax.vmap(stocked[0].refill), state)

    def block(state, keys):  # the refill the next block needs, then its steps
        env, size = stocked
        state, refills, fresh = refilled(lambda s: refill_stocks(env, s, size), state)
        state, (dones, _, read) = jax.lax.scan(body, state, keys)
        return state, (dones.sum(), refills, fresh, read.sum())

    def start(key):
        return reset(key) if stocked is None else full(reset(key))[0]

    def run(key, state):
        keys = jax.random.split(key, steps)
        if stocked is None:
            state, sums = jax.lax.scan(body, state, keys)
            dones, refills, read = jax.tree.map(jnp.sum, sums)
            return (dones, refills, jnp.int32(0), read), state
        size = stocked[1]
        blocks, rest = divmod(steps, size)
        state, sums = jax.lax.scan(block, state, keys[: blocks * size].reshape(blocks, size))
        sums = jax.tree.map(jnp.sum, sums)
        if rest:
            state, more = block(state, keys[blocks * size :])
            sums = jax.tree.map(jnp.add, sums, more)
        state, refills, computed = full(state)
        dones, n, c, read = sums
        return (dones, n + refills, c + computed, read), state

    return _Rollout(jax.jit(start), jax.jit(run, donate_argnums=1))


def _control_flow(hlo: str) -> dict[str, int]:
    """How many loops and conditionals a compiled program runs (its HLO text). On a GPU
    each trip of a loop and each conditional waits for the host to read a predicate."""
    return {op: len(re.findall(rf"\s{op}\(", hlo)) for op in ("while", "conditional")}


def _ablated(env: ContextualEnv, what: str) -> ContextualEnv:
    """Diagnostics only (not exact): switch off one part of the contextual step."""
    if what == "norefill":
        if env.reset_strategy != "pool":
            raise ValueError("ablate_norefill runs the pool strategy, not another")

        def stale(done, operand, current, pending, ready):  # every entry counts as ready
            picked = jax.tree.map(lambda n, o: jnp.where(done, n, o), pending, current)
            return picked, pending, jnp.ones_like(ready)

        env._select = stale  # noqa: SLF001
    elif what == "noreset":
        if env.reset_strategy == "pool":
            raise ValueError("ablate_noreset runs a stateless strategy (dense, loop), not pool")
        env._select = lambda done, operand, current: current  # noqa: SLF001
    elif what == "norebuild":
        call = env._call  # noqa: SLF001
        base_step = env._env.step  # noqa: SLF001

        def _call(fn, context, *args):
            return fn(*args) if fn == base_step else call(fn, context, *args)

        env._call = _call  # noqa: SLF001
    else:
        raise ValueError(
            f"unknown ablation {what!r}: choose one of noreset, norebuild, norefill "
            "(nofence went with MJX's CPU fence on 2026-11-28)"
        )
    return env


class _FirstOrder(C.Binding):
    """contextual_firstorder: derives nothing; the setters' first-order weights stay."""

    @property
    def derives(self) -> tuple[str, ...]:
        return ()


class _PerStep(C.Binding):
    """contextual_perstep: nothing carried; `apply` computes the weights at each call."""

    def derive(self, context):
        return {}

    def apply(self, context, derived=None):
        return super().apply(context)


_BINDINGS = {"contextual_firstorder": _FirstOrder, "contextual_perstep": _PerStep}
_ABLATIONS = ("noreset", "norebuild", "norefill")
VARIANTS = (
    *MAIN,
    *(v for v in _DR if v != "brax_dr"),
    "brax_dr_metarl",
    *(f"contextual_{s}" for s in RESET_STRATEGIES),
    "contextual_stock:<depth>",
    "contextual_pool_dense",
    "contextual_pool_cond",
    *_BINDINGS,
    *(f"ablate_{a}[:<strategy>]" for a in _ABLATIONS),
)


def _known_variant(label: str) -> bool:
    """Whether `_build` knows the variant `label` (an ablation's strategy is checked
    when it is built)."""
    if re.fullmatch(r"contextual_stock:[1-9][0-9]*", label):
        return True
    name = label.partition(":")[0] if label.startswith("ablate_") else label
    return name in VARIANTS or name.removeprefix("ablate_") in _ABLATIONS


def _build(label: str, name: str, n: int, cfg: Config):
    kwargs = {} if cfg.backend is None else {"backend": cfg.backend}
    raw_keys = lambda key: jax.random.split(jax.random.key_data(key), n)  # noqa: E731
    if label == "plain" or label in _DR or label == "brax_dr_metarl":
        env = brax_envs.get_environment(name, **kwargs)
        if label == "brax_dr_metarl":
            binding = make_contextual(env, _space(env.sys, env.backend)).binding
            extra = {"randomization_fn": _metarl_randomizer(binding, n)}
        elif label in _DR:
            extra = {"randomization_fn": _brax_randomizer(n, **_DR[label])}
        else:
            extra = {}
        env = brax_training.wrap(env, episode_length=1000, **extra)
        return _rollout(lambda k: env.reset(raw_keys(k)), env.step, env.action_size, n, cfg.steps)
    strategy, depth = cfg.strategy, cfg.stock_depth
    if label in ("contextual_pool_dense", "contextual_pool_cond"):
        strategy = "pool"
    elif label in _BINDINGS:
        pass  # cfg.strategy
    elif label.startswith("contextual_stock:"):
        strategy, depth = "stock", int(label.partition(":")[2])
    elif label.startswith("contextual_"):
        strategy = label.removeprefix("contextual_")
    elif label.startswith("ablate_"):
        label, _, strategy = label.partition(":")
        strategy = strategy or ("pool" if label == "ablate_norefill" else "dense")
    elif label != "contextual":
        raise ValueError(f"unknown variant {label!r}")
    ctx = make_contextual(
        name,
        _space(brax_envs.get_environment(name, **kwargs).sys, kwargs.get("backend", "generalized")),
        episode_length=1000,
        reset_chunk=cfg.reset_chunk,
        reset_strategy=strategy,
        **kwargs,
    )
    _STRATEGY[name, label] = ctx.reset_strategy  # what "auto" resolved to
    if label.startswith("ablate_"):
        ctx = _ablated(ctx, label.removeprefix("ablate_"))
    if label == "contextual_pool_dense":
        ctx._select = pooled_where_done(ctx._fresh, cfg.reset_chunk, refill="dense")  # noqa: SLF001
    if label == "contextual_pool_cond":
        ctx._select = pooled_where_done(ctx._fresh, cfg.reset_chunk, guard="cond")  # noqa: SLF001
    if label in _BINDINGS:
        fields = {f.name: getattr(ctx.binding, f.name) for f in dataclasses.fields(ctx.binding)}
        ctx.binding = _BINDINGS[label](**fields)
    if ctx.reset_strategy == "stock":  # as PPO's rollout steps it (also "auto" on a GPU)
        stock = jax.vmap(functools.partial(ctx.stock, depth=depth))
        return _rollout(
            lambda k: stock(jax.vmap(ctx.reset)(jax.random.split(k, n))),
            jax.vmap(ctx.step),
            ctx.action_size,
            n,
            cfg.steps,
            stocked=(ctx, cfg.stock_block),
        )
    return _rollout(
        lambda k: jax.vmap(ctx.reset)(jax.random.split(k, n)),
        jax.vmap(ctx.step),
        ctx.action_size,
        n,
        cfg.steps,
    )


def _warm_up(name: str, cfg: Config) -> None:
    """Compiles one variant at 2 envs x 2 steps, untimed. A process's first compile
    pays a one-off cost (0.7-1.1 s on 2 CPU cores, inverted_pendulum) that later
    ones skip; timed first, plain Brax would carry it and every compile ratio would
    read low. A contextual variant is the one warmed: it traces Brax's own reset and
    step too."""
    if name in _WARM:  # once per env and process
        return
    label = next((v for v in cfg.variants if v.startswith("contextual")), cfg.variants[0])
    rollout = _build(label, name, 2, dataclasses.replace(cfg, steps=2))
    key = jax.random.key(0)
    rollout.run.lower(key, rollout.start(key)).compile()
    _WARM.add(name)


_WARM: set[str] = set()
_STRATEGY: dict[tuple[str, str], str] = {}  # (env, contextual variant) -> reset strategy run


def bench(name: str, n: int, cfg: Config) -> dict:
    _warm_up(name, cfg)
    runs = {label: _build(label, name, n, cfg) for label in cfg.variants}
    key = jax.random.key(0)
    compile_s, dones, refills, fresh, flow, carried = {}, {}, {}, {}, {}, {}
    for label, rollout in runs.items():
        t0 = time.perf_counter()  # both programs: the first reset is compiled too
        start = rollout.start.lower(key).compile()
        compiled = rollout.run.lower(key, jax.eval_shape(rollout.start, key)).compile()
        compile_s[label] = time.perf_counter() - t0
        hlo = compiled.as_text()  # the steps' program
        flow[label] = _control_flow(hlo)
        carried[label] = max(loop_carries(hlo), default=0)
        if cfg.dump_hlo:
            path = Path(cfg.dump_hlo) / f"{name}_{n}_{label.replace(':', '_')}.hlo.gz"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(gzip.compress(hlo.encode()))
        print(
            f"  compiled {name} {label} ({n} envs) in {compile_s[label]:.1f} s; "
            f"{flow[label]['while']} loops, {flow[label]['conditional']} conditionals; "
            f"a loop carries at most {carried[label]:,} numbers",
            flush=True,
        )
        runs[label] = _Rollout(start, compiled)
        dones[label], refills[label], fresh[label] = map(int, compiled(key, start(key))[0][:3])
    times = {label: [] for label in runs}
    labels = list(runs)
    for r in range(cfg.rounds):
        k = jax.random.key(r + 1)
        # each round starts with another variant: pairing cancels drift, not a cost
        # (or gain) of running first or last in a round
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            rollout = runs[label]
            state = jax.block_until_ready(rollout.start(k))  # untimed
            t0 = time.perf_counter()
            jax.block_until_ready(rollout.run(k, state))
            times[label].append(time.perf_counter() - t0)
            del state
    base = np.asarray(times["plain"]) if "plain" in times else None
    print(
        f"\n{name} ({cfg.backend or 'default backend'}), {n} envs, "
        f"{cfg.steps} steps x {cfg.rounds} paired rounds"
    )
    # One aggregate for both columns: the geometric mean over rounds. Steps/s is steps
    # over the geometric mean of a variant's times, the ratio the geometric mean of the
    # paired rounds' ratios, so a ratio is that of its two steps/s. (The median of
    # the paired ratios, printed before, is the middle round of 3; a stored H200
    # hopper run read 0.980 there against 0.953 between its steps/s columns.)
    print(
        f"{'variant':<22}{'steps/s':>12}{'ratio (geo. mean [95% CI], min-max)':>44}"
        f"{'compile s':>11}{'ratio':>7}{'dones/step':>12}{'refills/step':>14}{'fresh/step':>12}"
    )
    result = {}
    for label, ts in times.items():
        ts = np.asarray(ts)
        sps = n * cfg.steps / _geomean(ts)
        paired = _paired(base if base is not None else np.full_like(ts, np.nan), ts)
        c_ratio = compile_s[label] / compile_s.get("plain", np.nan)
        print(
            f"{label:<22}{sps:>12,.0f}{_ratio_text(paired):>44}{compile_s[label]:>11.1f}{c_ratio:>7.2f}"
            f"{dones[label] / cfg.steps:>12.1f}{refills[label] / cfg.steps:>14.3f}"
            f"{fresh[label] / cfg.steps:>12.1f}"
        )
        result[label] = {
            "steps_per_s": float(sps),  # over the geometric mean of the rounds' times
            **paired,  # its ratio = steps_per_s / plain's steps_per_s
            "compile_s": float(compile_s[label]),
            "compile_ratio": float(c_ratio),
            "reset_strategy": _STRATEGY.get((name, label)),
            "control_flow": flow[label],
            "most_carried": carried[label],
            "dones_per_step": dones[label] / cfg.steps,
            "refills_per_step": refills[label] / cfg.steps,
            "fresh_per_step": fresh[label] / cfg.steps,  # the stock's: computed by its refills
            "times_s": ts.tolist(),
        }
    if cfg.profile:
        traces = None if cfg.trace_dir is None else Path(cfg.trace_dir) / f"{name}_{n}"
        _print_profile(result, runs, cfg.steps, traces, cfg.profile_rounds)
    return result


# (scope, stage): an operation's stage is that of the first scope in its instruction's
# op_name (innermost first where they nest: a reset runs MJX's whole forward). MJX
# names its stages with `jax.named_scope` (a component of the op_name as it is);
# metarl's resets are `ContextualEnv._fresh` (a step's) and `_fresh_at` (a stock's
# refill), jitted (in any vmap or jit wrapper).
RESETS = ("_fresh", "_fresh_at")
STAGES = (
    *((scope, "resets") for scope in RESETS),
    ("solve", "solver"),
    ("fwd_position", "position"),
    ("fwd_velocity", "velocity"),
    ("fwd_actuation", "actuation"),
    ("fwd_acceleration", "acceleration"),
    ("euler", "integration"),
    ("implicit", "integration"),
    ("rk4", "integration"),
    ("forward", "forward, other"),
)
REST = "rest"  # the step outside MJX's stages: Brax's wrappers, metarl's step, the rollout


def _stages(hlo: str) -> dict[str, str]:
    """{instruction name: stage} of a compiled program's text (`STAGES`; `REST` for an
    instruction in none of them, or without an op_name)."""
    out = {}
    for line in hlo.splitlines():
        instruction = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = ", line)
        if instruction is None:
            continue
        meta = re.search(r'op_name="([^"]*)"', line)
        parts = meta.group(1).split("/") if meta else []
        bare = {re.sub(r"^(?:[\w.]+\()+|\)+$", "", p) for p in parts}  # vmap(jit(f)) -> f
        out[instruction.group(1)] = next(
            (s for scope, s in STAGES if scope in (bare if scope in RESETS else parts)), REST
        )
    return out


def _op_times(compiled, *args, keep: Path | None = None) -> dict[str, tuple[float, int]]:
    """{operation: (seconds, runs)} of one call `compiled(*args)`, from a `jax.profiler`
    trace (kept in the new folder `keep` if given): a GPU's kernels (`_gpu_ops`) where
    JAX's default backend is a GPU, else the CPU runtime's operations. On a CPU, XLA's runtime
    records every operation it runs (a fusion, a dot) on the thread that ran it, with
    its `hlo_op` (until 2026-11-27 the Python thread was told apart by its name,
    "python": run as `python3`, its calls, `stop_trace` among them, counted as operations);
    operations running in parallel both count. A loop or a conditional is recorded as
    one span around the operations it runs, which are recorded too: only the innermost
    spans count."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = tmp if keep is None else str(keep)
        jax.profiler.start_trace(folder)
        jax.block_until_ready(compiled(*args))
        jax.profiler.stop_trace()
        newest = max(Path(folder).rglob("*.xplane.pb"), key=lambda f: f.stat().st_mtime)
        trace = jax.profiler.ProfileData.from_file(str(newest))
    if jax.default_backend() == "gpu":
        return _gpu_ops([plane for plane in trace.planes if plane.name.startswith("/device:GPU")])
    ops: dict[str, tuple[float, int]] = {}
    for plane in trace.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:  # a thread
            spans = sorted(  # an operation names its HLO instruction; Python's and the
                # runtime's own events (on any thread, whatever its name) do not
                (e.start_ns, -e.duration_ns, e.name)
                for e in line.events
                if "hlo_op" in dict(e.stats)
            )
            for i, (start, minus, name) in enumerate(spans):
                if i + 1 < len(spans) and spans[i + 1][0] < start - minus:
                    continue  # the next span starts inside this one
                seconds, runs = ops.get(name, (0.0, 0))
                ops[name] = (seconds - minus * 1e-9, runs + 1)
    return ops


def _gpu_ops(planes) -> dict[str, tuple[float, int]]:
    """{operation: (seconds, runs)} of the kernels on a GPU's streams (the trace's device
    planes), each named by the HLO operation it runs (its `hlo_op`) and its kernel: an
    operation compiled into two kernels counts as two. Memory copies count too (a
    loop's predicate read back by the host is one per trip)."""
    ops: dict[str, tuple[float, int]] = {}
    for plane in planes:
        for line in plane.lines:
            if not line.name.startswith("Stream"):
                continue
            for event in line.events:
                op = dict(event.stats).get("hlo_op")
                name = event.name if op is None else f"{op}: {event.name}"
                seconds, runs = ops.get(name, (0.0, 0))
                ops[name] = (seconds + event.duration_ns * 1e-9, runs + 1)
    if not ops:  # no device plane where the profiler could not load CUPTI
        lines = sorted({f"{p.name}/{line.name}" for p in planes for line in p.lines})
        print(f"  no kernel found on a GPU's streams (device lines: {lines}); see --trace-dir")
    return ops


def _rollout_ops(
    rollout: _Rollout, key: jax.Array, keep: Path | None = None
) -> dict[str, tuple[float, int]]:
    """`_op_times` of one timed rollout from `rollout.start(key)`'s state, made before the
    trace starts: dispatched asynchronously, the start ran inside the trace and its
    operations counted as the rollout's (until 2026-11-27, the stock's first fill,
    `depth` resets per env, inflated its "step" figures)."""
    return _op_times(rollout.run, key, jax.block_until_ready(rollout.start(key)), keep=keep)


def _print_profile(
    result: dict, runs: dict, steps: int, traces: Path | None, rounds: int = 1
) -> None:
    """Adds each variant's operation time per batched step to `result`, split by how often
    an operation runs: more than once a step (the physics substeps), at most once a
    step (the step's own work, the resets), once a rollout; and by stage (`STAGES`,
    read from the compiled program). `rounds` traces per variant, in paired rounds
    (each round traces every variant in turn); each figure is their median, with the
    total's min-max. `traces`: a folder stem for the first round's raw traces, one
    folder per variant (None: not kept)."""
    key = jax.random.key(0)  # the key of the untimed first run
    stages = {label: _stages(rollout.run.as_text()) for label, rollout in runs.items()}
    # One trace thrown away first: on 2 CPU cores the first trace of a process summed
    # more operation time than the next ones; one trace to the next of the same program
    # varied by up to 9% there (ant and inverted_pendulum on MJX): compare medians
    _rollout_ops(next(iter(runs.values())), key)
    splits = {label: [] for label in runs}
    for r in range(rounds):
        for label, rollout in runs.items():
            keep = None
            if traces is not None and r == 0:
                keep = Path(f"{traces}_{label.replace(':', '_')}")
            ops = _rollout_ops(rollout, key, keep)
            split = {"substeps": 0.0, "step": 0.0, "once": 0.0}
            for seconds, count in ops.values():
                part = "substeps" if count > steps else "step" if count > 1 else "once"
                split[part] += seconds * 1e3 / steps
            split["total"] = sum(split.values())
            split["ops"] = len(ops)
            # runs of every operation per batched step: on a GPU the kernels and copies
            # launched (benchmarks/gpu_program.py counts them from the program alone)
            split["launches"] = sum(count for _, count in ops.values()) / steps
            splits[label].append((split, _by_stage(ops, stages[label], steps)))
    where = "GPU kernels" if jax.default_backend() == "gpu" else "summed over threads"
    # per step of the whole batch (every env stepping once), not per env
    print(f"\noperation time per batched step (ms, {where}), {steps} steps, median of {rounds}")
    print(
        f"{'variant':<22}{'total':>9}{'(min-max)':>16}{'substeps':>10}{'step':>8}{'once':>8}"
        f"{'ops':>6}{'launches/step':>15}"
    )
    by_stage = {}
    for label, rows in splits.items():
        totals = [row[0]["total"] for row in rows]
        split = {part: _median(rows, 0, part) for part in ("total", "substeps", "step", "once")}
        print(
            f"{label:<22}{split['total']:>9.2f}  ({min(totals):.2f}-{max(totals):.2f})"
            f"{split['substeps']:>10.2f}{split['step']:>8.2f}{split['once']:>8.2f}"
            f"{rows[0][0]['ops']:>6}{rows[0][0]['launches']:>15.1f}"
        )
        result[label]["op_ms_per_step"] = {
            **split,
            "ops": rows[0][0]["ops"],  # distinct operations (GPU: kernels by HLO operation)
            "launches_per_step": rows[0][0]["launches"],
            "total_min": min(totals),
            "total_max": max(totals),
        }
        by_stage[label] = {s: _median(rows, 1, s) for s in {k for row in rows for k in row[1]}}
        result[label]["op_ms_per_step_by_stage"] = by_stage[label]
    columns = [
        s for s in dict.fromkeys(s for _, s in STAGES) if any(s in v for v in by_stage.values())
    ]
    columns.append(REST)
    print(f"\nthe same by stage (ms per batched step, medians; {REST}: outside MJX's named stages)")
    print(f"{'variant':<22}" + "".join(f"{c:>14}" for c in columns))
    for label, stage_ms in by_stage.items():
        print(f"{label:<22}" + "".join(f"{stage_ms.get(c, 0.0):>14.2f}" for c in columns))


def _geomean(x: np.ndarray) -> float:
    return float(np.exp(np.mean(np.log(x))))


def _paired(base: np.ndarray, times: np.ndarray) -> dict[str, float]:
    """A variant's paired rounds against plain Brax's: the ratio (their geometric
    mean), its 95% confidence interval, its range, and the median the files before
    2026-12-05 reported. The interval is the t interval of the rounds' log ratios
    (`_cli.paired_ratio`), taken back from logs: it reads each round as
    an independent draw of the machine's noise, so it says whether a ratio differs
    from a target by more than its rounds disagree (NaN with fewer than 2 rounds)."""
    base, times = np.asarray(base, np.float64), np.asarray(times, np.float64)
    r = base / times
    ratio, low, high = paired_ratio(base, times)
    return {
        "ratio": ratio,
        "ratio_ci_low": low,
        "ratio_ci_high": high,
        "ratio_median": float(np.median(r)),
        "ratio_min": float(r.min()),
        "ratio_max": float(r.max()),
    }


def _ratio_text(p: dict[str, float]) -> str:
    """``"0.967 [0.903, 1.036] (0.926-0.995)"``: the ratio, its 95% CI, its range."""
    return (
        f"{p['ratio']:.3f} [{p['ratio_ci_low']:.3f}, {p['ratio_ci_high']:.3f}] "
        f"({p['ratio_min']:.3f}-{p['ratio_max']:.3f})"
    )


def _median(rows: list, i: int, part: str) -> float:
    return float(np.median([row[i].get(part, 0.0) for row in rows]))


def _by_stage(ops: dict[str, tuple[float, int]], stages: dict[str, str], steps: int) -> dict:
    """`_op_times`' operations summed per stage, in ms per batched step. A GPU's operation
    ("hlo_op: kernel") by its HLO instruction; one that names none (a memory copy, a
    kernel outside the program) is `REST`."""
    out: dict[str, float] = {}
    for name, (seconds, _) in ops.items():
        stage = stages.get(name.split(": ")[0], REST)
        out[stage] = out.get(stage, 0.0) + seconds * 1e3 / steps
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(results["envs"])
    fig, axes = plt.subplots(1, len(envs), figsize=(max(6.0, 4.5 * len(envs)), 4.2), squeeze=False)
    for ax, name in zip(axes[0], envs, strict=True):
        per_n = results["envs"][name]
        ns = sorted(int(n) for n in per_n)
        for label in [v for v in MAIN if v in per_n[str(ns[0])]]:
            ax.plot(ns, [per_n[str(n)][label]["steps_per_s"] for n in ns], "o-", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("num_envs")
        ax.set_ylabel("env steps / s")
        ax.set_title(name)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(
        f"{results['device']}, jax {results['jax']}, {results['steps']} steps per call",
        fontsize="medium",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def summarize(paths: tuple[str, ...]) -> dict:
    """{file: {env: {num_envs: {variant: `_paired`'s dict}}}} of stored result files,
    each variant's ratio to plain Brax as `bench` now gives it (the geometric mean of
    the paired rounds' ratios, with its 95% CI), printed beside the median that files
    before 2026-12-05 reported. Runs without plain Brax or per-round times are left
    out, said so."""
    out = {}
    for path in paths:
        stored = json.loads(Path(path).read_text())
        out[path] = {}
        if "envs" not in stored:
            print(f"{path}: not a result file of this script (no 'envs'), left out")
        for name, per_n in stored.get("envs", {}).items():
            for n, runs in per_n.items():
                times = {k: np.asarray(v.get("times_s", []), float) for k, v in runs.items()}
                if "plain" not in times or not all(len(t) for t in times.values()):
                    print(f"{path}: {name} {n}: no plain Brax or no per-round times, left out")
                    continue
                base = times["plain"]
                print(f"{path}: {name}, {n} envs, {len(base)} paired rounds")
                head = "ratio (geo. mean [95% CI], min-max)"
                print(f"  {'variant':<26}{head:>44}{'median':>9}")
                rows = out[path].setdefault(name, {}).setdefault(n, {})
                for label, ts in times.items():
                    rows[label] = p = _paired(base, ts)
                    print(f"  {label:<26}{_ratio_text(p):>44}{p['ratio_median']:>9.3f}")
    return out


def main(cfg: Config) -> None:
    if cfg.summarize:
        summarize(cfg.summarize)
        return
    device = jax.devices()[0]
    print(f"jax {jax.__version__} on {device.platform} ({device.device_kind})")
    if cfg.trace_dir is not None and not cfg.profile:  # before any env is timed
        raise ValueError("--trace-dir keeps --profile's traces: add --profile")
    if cfg.profile_rounds < 1 or (cfg.profile_rounds > 1 and not cfg.profile):
        raise ValueError(
            f"--profile-rounds {cfg.profile_rounds}: the number of traces per variant of "
            "--profile, an integer >= 1 (more than 1 with --profile only)"
        )
    results = {
        "device": device.device_kind,
        "platform": provenance.platform(),  # XLA_FLAGS, JAX settings, device count, host CPU
        "jax": jax.__version__,
        "software": provenance.software(),
        "steps": cfg.steps,
        "rounds": cfg.rounds,
        "strategy": cfg.strategy,
        "reset_chunk": cfg.reset_chunk,
        "backend": cfg.backend,
        "variants": list(cfg.variants),
        "config": dataclasses.asdict(cfg),  # every setting, the stock's depth and block too
        "envs": {},
    }
    for name in cfg.envs:
        results["envs"][name] = {}
        for n in cfg.num_envs:
            results["envs"][name][str(n)] = bench(name, n, cfg)
            if cfg.out:
                Path(cfg.out).with_suffix(".json").write_text(json.dumps(results, indent=1))
    if cfg.out:
        print(f"wrote {Path(cfg.out).with_suffix('.json')}")
        if len(cfg.num_envs) > 1 and set(MAIN) & set(cfg.variants):
            plot(results, Path(cfg.out).with_suffix(".png"))
            print(f"wrote {Path(cfg.out).with_suffix('.png')}")


if __name__ == "__main__":
    main(tyro.cli(Config))
