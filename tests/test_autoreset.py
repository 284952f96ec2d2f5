"""Reset strategies: the same episodes and states, to float rounding (each
strategy's program is compiled apart: metarl/envs/autoreset.py), and the state a
done env restarts from is its own fresh reset."""

from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from brax import envs as brax_envs
from brax.envs.wrappers import training as brax_training
from conftest import load_benchmark, with_xla_defaults

from metarl import contexts as C
from metarl.compilation import loop_carries
from metarl.envs import RESET_STRATEGIES, make_contextual, refill_stocks
from metarl.envs.autoreset import POOLED, pooled_where_done, where_done

STATELESS = [s for s in RESET_STRATEGIES if s not in POOLED]


def _fresh(operand):
    key, scale = operand
    return {"x": jax.random.uniform(key, (3,), minval=1.0, maxval=2.0) * scale, "n": jnp.int32(7)}


@pytest.mark.parametrize("chunk", [0.25, 1.0])
@pytest.mark.parametrize("strategy", STATELESS)
def test_where_done_matches_plain_select(strategy, chunk):
    select = where_done(_fresh, chunk, strategy)
    n = 10
    keys = jax.random.split(jax.random.key(0), n)
    scale = jnp.arange(n, dtype=jnp.float32)
    current = {"x": -jnp.ones((n, 3)), "n": jnp.arange(n, dtype=jnp.int32)}
    for pattern in ([0] * n, [1] * n, [0, 1, 1, 0, 0, 0, 1, 0, 1, 1], [1] + [0] * (n - 1)):
        done = jnp.asarray(pattern, bool)
        got = jax.jit(jax.vmap(select))(done, (keys, scale), current)
        fresh = jax.jit(jax.vmap(_fresh))((keys, scale))
        for name in ("x", "n"):
            d = done.reshape((n,) + (1,) * (current[name].ndim - 1))
            want = np.where(d, fresh[name], current[name])
            np.testing.assert_array_equal(got[name], want)


@pytest.mark.parametrize("strategy", STATELESS)
def test_where_done_nested_vmap(strategy):
    select = where_done(_fresh, 0.5, strategy)
    keys = jax.random.split(jax.random.key(1), 6).reshape(2, 3)
    scale = jnp.ones((2, 3))
    done = jnp.asarray([[True, False, True], [False, False, True]])
    current = {"x": jnp.zeros((2, 3, 3)), "n": jnp.zeros((2, 3), jnp.int32)}
    got = jax.jit(jax.vmap(jax.vmap(select)))(done, (keys, scale), current)
    np.testing.assert_array_equal(got["n"], np.where(done, 7, 0))
    assert np.all((np.abs(got["x"]).sum(-1) > 0) == np.asarray(done))


@pytest.mark.parametrize("strategy", STATELESS)
def test_a_reset_keeps_no_dead_state_alive(strategy):
    """A field the physics recomputes before reading it (here `big`, as MJX's data
    beyond positions and velocities) is dropped from every loop of a rollout, as from
    plain Brax's. With the loop's chunks in a `while_loop`, which JAX's dead-code
    elimination does not enter, the rollout's loops carried it (10,055 numbers against
    19 here)."""
    n = 8

    def fresh(key):
        return {"q": jnp.zeros(()), "big": jax.random.uniform(key, (1000,))}

    select = jax.vmap(where_done(fresh, 0.25, strategy))

    def run(state, keys):
        def substep(s, _):  # `big` recomputed from q, never read in
            big = jnp.sin(s["q"])[:, None] * jnp.ones(1000)
            return {"q": s["q"] + big[:, 0] * 0.01 + 0.3, "big": big}, None

        def step(s, k):
            s = jax.lax.scan(substep, s, None, length=5)[0]
            s = select(s["q"] > 3.0, jax.random.split(k, n), s)
            return s, s["q"].sum()

        return jax.lax.scan(step, state, keys)[1]

    state = {"q": jnp.arange(n, dtype=jnp.float32) / 2, "big": jnp.zeros((n, 1000))}
    keys = jax.random.split(jax.random.key(0), 10)
    compiled = jax.jit(run).lower(state, keys).compile()
    assert loop_carries(compiled.as_text())[0] < 1000


@pytest.mark.parametrize(
    ("refill", "guard"), [("loop", "loop"), ("dense", "loop"), ("dense", "cond")]
)
def test_pool_refills_only_when_a_done_env_needs_it(refill, guard):
    select = jax.jit(jax.vmap(pooled_where_done(_fresh, 0.5, refill, guard)))
    n = 6
    keys = jax.random.split(jax.random.key(0), n)
    scale = jnp.arange(1, n + 1, dtype=jnp.float32)
    fresh = jax.vmap(_fresh)((keys, scale))
    current = {"x": -jnp.ones((n, 3)), "n": jnp.zeros(n, jnp.int32)}
    empty = jax.tree.map(jnp.zeros_like, current)
    done = jnp.asarray([1, 0, 0, 1, 0, 0], bool)
    # an empty pool: filled for every env, the done ones take their entry
    out, pending, ready = select(done, (keys, scale), current, empty, jnp.zeros(n, bool))
    np.testing.assert_array_equal(pending["x"], fresh["x"])
    np.testing.assert_array_equal(out["x"], np.where(done[:, None], fresh["x"], -1.0))
    np.testing.assert_array_equal(ready, ~done)
    # envs whose entry is ready take it as it is: no refill (a marked pool shows it)
    marked = jax.tree.map(lambda x: x + 100, pending)
    done2 = jnp.asarray([0, 1, 0, 0, 0, 1], bool)
    out, pending2, ready2 = select(done2, (keys, scale), current, marked, ready)
    np.testing.assert_array_equal(out["x"], np.where(done2[:, None], fresh["x"] + 100, -1.0))
    np.testing.assert_array_equal(pending2["x"][0], marked["x"][0])
    np.testing.assert_array_equal(ready2, ready & ~done2)
    # a done env with a used entry: the pool is refilled where not ready
    out, pending3, ready3 = select(done, (keys, scale), current, pending2, ready2)
    np.testing.assert_array_equal(out["x"], np.where(done[:, None], fresh["x"], -1.0))
    np.testing.assert_array_equal(pending3["x"][2], marked["x"][2])  # was ready: kept
    np.testing.assert_array_equal(pending3["x"][1], fresh["x"][1])  # was used: refilled
    np.testing.assert_array_equal(ready3, ~done)


def test_unknown_strategy_lists_the_choices():
    with pytest.raises(ValueError, match="dense"):
        make_contextual("inverted_pendulum", C.ContextSpace({}), reset_strategy="fast")
    with pytest.raises(ValueError, match="loop"):
        where_done(_fresh, 0.5, "sparse")
    with pytest.raises(ValueError, match="pooled_where_done"):
        where_done(_fresh, 0.5, "pool")
    with pytest.raises(ValueError, match="choose one of loop, cond"):
        pooled_where_done(_fresh, 0.5, guard="while")


def test_strategies_agree_on_env_states(backend="generalized"):
    """A real Brax env, episodes ending at different steps (short episodes and
    random actions), trials of 2 episodes, ranges replaced mid-run: compact, the pool
    and the stock (shallow and deep) end the same episodes and trials at the same
    steps as the loop, draw the same contexts, and their states agree with the loop's
    to float rounding (2026-11-28: bit for bit with XLA's defaults, 1.5e-8 apart with
    the tests' optimization level 0, tests/conftest.py; a done env restarted from
    another env's reset is 1e-3 or more apart). Resets happened."""
    space = C.ContextSpace(
        {"gravity": C.Scale(0.5, 1.5), "mass": C.Scale(0.7, 1.3, per_element=True)}
    )
    narrow = C.ContextSpace(
        {"gravity": C.Scale(1.9, 2.0), "mass": C.Scale(0.7, 1.3, per_element=True)}
    )
    n, steps = 6, 40
    rollouts = {}
    # "auto" is "loop" here. The env runs every stateless strategy, and the pool's
    # refills (dense, decided by lax.cond), through one select function each: the
    # functions are checked alike above (test_where_done_matches_plain_select,
    # test_pool_refills_only_when_a_done_env_needs_it), one of each kind here (dense:
    # test_strategies_agree_on_mjx), each env program 6 s to compile.
    for strategy in ("loop", "compact", "pool"):
        env = _trial_env(space, backend, strategy)

        def run(key, env=env):
            state = jax.vmap(env.reset)(jax.random.split(key, n))
            set_narrow = jax.vmap(env.set_ranges, in_axes=(0, None))

            def body(state, xs):
                t, k = xs  # one scan (one compiled step): the ranges change halfway
                state = jax.lax.cond(
                    t == steps // 2, lambda s: set_narrow(s, narrow), lambda s: s, state
                )
                a = jax.random.uniform(k, (n, env.action_size), minval=-1, maxval=1)
                state = jax.vmap(env.step)(state, a)
                return state, _outputs(state)

            keys = jax.random.split(key, steps)
            state, traj = jax.lax.scan(body, state, (jnp.arange(steps), keys))
            info = {k: v for k, v in state.info.items() if k != "reset_pool"}
            return state.replace(info=info), traj

        rollouts[strategy] = jax.jit(run)(jax.random.key(3))
    rollouts["stock"] = _stocked_rollout(space, narrow, backend, n, steps, depth=4)
    # deeper than its blocks: refilled only where some env could run short, in whole chunks
    rollouts["stock_deep"] = _stocked_rollout(space, narrow, backend, n, steps, depth=16, block=4)
    _, traj = rollouts["loop"]
    gravity, done, new_trial = traj["gravity"], traj["done"], traj["new_trial"]
    assert 0 < float(new_trial.sum()) < float(done.sum())
    # a new trial starts in a new context; the trial's second episode keeps it
    changed = np.asarray(gravity[1:] != gravity[:-1])
    np.testing.assert_array_equal(changed, np.asarray(new_trial[1:] > 0))
    # contexts drawn after set_ranges come from the new ranges (x1.9-2.0, not x0.5-1.5)
    early, late = np.abs(gravity[: steps // 2]), np.abs(gravity[steps // 2 :])
    assert late.max() >= 1.9 / 1.5 * early.max()
    for strategy, rollout in rollouts.items():
        _assert_agree(rollout, rollouts["loop"], 1e-5, strategy)


FLAGS = ("done", "truncated", "nonfinite", "new_episode", "new_trial", "current_ranges")


def _assert_agree(got, want, atol: float, strategy: str) -> None:
    """Two strategies' rollouts: FLAGS (episode ends, trial starts), keys and
    counters equal, floats within `atol` (rounding: the strategies' programs are compiled apart)."""
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want), strict=True
    ):
        a, b, name = _raw(a), _raw(b), f"{strategy}: {jax.tree_util.keystr(path)}"
        leaf = getattr(path[-1], "key", getattr(path[-1], "name", None))
        exact = not np.issubdtype(a.dtype, np.floating) or leaf in FLAGS
        if exact:
            np.testing.assert_array_equal(a, b, err_msg=name)
        else:
            np.testing.assert_allclose(a, b, rtol=0, atol=atol, err_msg=name)


def _outputs(state) -> dict:
    return {
        "obs": state.obs,
        "gravity": state.info["context"]["gravity"],
        "done": state.done,
        "new_trial": state.info["trial"].new_trial,
    }


def _trial_env(space, backend, strategy):
    """inverted_pendulum in episodes of at most 9 steps, trials of 2 episodes."""
    return make_contextual(
        "inverted_pendulum",
        space,
        backend=backend,
        episode_length=9,
        episodes_per_trial=2,
        reset_strategy=strategy,
    )


def _stocked_rollout(space, narrow, backend, n, steps, depth, block=None):
    """`test_strategies_agree_on_env_states`'s rollout as PPO's rollout runs the
    pool: each env stocked with `depth` fresh states, `refill_stocks` before every
    `block` steps (default `depth`; after the ranges change), steps that never reset."""
    env = _trial_env(space, backend, "stock")
    block = block or depth

    def run(key):
        state = jax.vmap(env.reset)(jax.random.split(key, n))
        state = jax.vmap(lambda s: env.stock(s, depth))(state)

        def run_block(state, xs):
            b, keys = xs
            state = jax.lax.cond(
                b * block == steps // 2,
                lambda s: jax.vmap(env.set_ranges, in_axes=(0, None))(s, narrow),
                lambda s: s,
                state,
            )
            state = refill_stocks(env, state, block)

            def body(state, k):
                a = jax.random.uniform(k, (n, env.action_size), minval=-1, maxval=1)
                state = jax.vmap(env.step)(state, a)
                return state, _outputs(state)

            return jax.lax.scan(body, state, keys)

        keys = jax.random.split(key, steps).reshape(steps // block, block)
        state, traj = jax.lax.scan(run_block, state, (jnp.arange(steps // block), keys))
        return state, jax.tree.map(lambda x: x.reshape((steps,) + x.shape[2:]), traj)

    state, traj = jax.jit(run)(jax.random.key(3))
    assert not np.asarray(state.info["reset_pool"].overrun).any()
    info = {k: v for k, v in state.info.items() if k != "reset_pool"}
    return state.replace(info=info), traj


def test_strategies_agree_on_mjx():
    """MJX's hopper, whose contacts amplify any rounding difference, with episodes
    ending and restarting: the loop, dense and the stock (stocked and refilled as
    PPO's rollout does) end the same episodes at the same steps, and their states
    agree to float rounding, not always bit for bit. Each strategy's program is
    compiled differently, and how XLA rounds it depends on the host CPU: bit for
    bit on 2026-11-28 on one host, 6.6e-7 apart from the first reset on an AVX-512
    host (benchmarks/strategy_agreement.py); an env restarted from another env's
    reset is 1e-1 or more apart. No strategy keeps alive more of MJX's data than
    plain Brax does: a barrier over the whole state, or a while loop, which JAX's
    dead-code elimination does not enter, kept all of it alive through every
    physics substep (17,016 numbers carried by one loop, against plain Brax's
    7,767; ant's step took 10% longer)."""
    agree = load_benchmark("strategy_agreement")
    cfg = agree.Config(num_envs=8)
    out, carried = {}, {}
    for strategy in ("loop", "dense", "stock"):
        run = agree.program(cfg, strategy)
        out[strategy] = dict(zip(agree.OUTPUTS, run(jax.random.key(cfg.seed)), strict=True))
        if strategy != "stock":  # the stock's loop carries its stock
            carried[strategy] = loop_carries(run.as_text())[0]
    assert out["loop"]["done"].sum() >= cfg.num_envs  # episodes ended and restarted
    for strategy in ("dense", "stock"):
        _assert_agree(out[strategy], out["loop"], 1e-4, strategy)
    plain = brax_training.wrap(brax_envs.get_environment(cfg.env, backend="mjx"))
    n = cfg.num_envs

    def run(key):
        state = plain.reset(jax.random.split(jax.random.key_data(key), n))

        def body(state, k):
            a = jax.random.uniform(k, (n, plain.action_size), minval=-1, maxval=1)
            state = plain.step(state, a)  # the outputs of `agree.program`'s loop
            return state, (state.obs, state.reward, state.done, state.pipeline_state.qpos)

        return jax.lax.scan(body, state, jax.random.split(key, cfg.steps))[1]

    most = loop_carries(jax.jit(run).lower(jax.random.key(0)).compile().as_text())[0]
    assert most > 0, "no loop found in plain Brax's program"
    assert max(carried.values()) <= 1.5 * most, (carried, most)


def test_auto_is_the_loop_on_a_cpu_and_the_stock_elsewhere():
    """auto: where JAX's default backend is a CPU, the loop; elsewhere the stock, on
    Brax's backends and on MJX (the state carries its pool, which PPO stocks). Decided
    when the env is built, so no step holds a platform switch: on an H200 a step
    holding `lax.platform_dependent` (of a fence, or of the loop and dense) ran
    MJX's ant at 0.76x of plain Brax, the same step without it at 1.00x
    (benchmarks/results/README.md). No program holds a barrier (MJX's CPU fence,
    until 2026-11-28, changed no state). Lowering for CUDA needs no GPU; the default
    backend is patched to say "gpu"."""
    space = C.ContextSpace({"gravity": C.Scale(0.5, 1.5)})
    built = {}
    for backend in ("generalized", "mjx"):
        cpu = make_contextual("inverted_pendulum", space, backend=backend)
        with mock.patch.object(jax, "default_backend", return_value="gpu"):
            gpu = make_contextual("inverted_pendulum", space, backend=backend)
        assert (cpu.reset_strategy, gpu.reset_strategy) == ("loop", "stock"), backend
        built[backend] = cpu, gpu
    keys = jax.random.split(jax.random.key(0), 4)
    mjx_cpu, mjx_gpu = built["mjx"]
    assert "reset_pool" not in jax.eval_shape(jax.vmap(mjx_cpu.reset), keys).info
    batch = jax.eval_shape(jax.vmap(mjx_gpu.reset), keys)
    stocked = jax.eval_shape(jax.vmap(lambda s: mjx_gpu.stock(s, 4)), batch)
    action = jax.ShapeDtypeStruct((4, mjx_gpu.action_size), jnp.float32)

    def program(env, batch, platform, backend):
        with mock.patch.object(jax, "default_backend", return_value=backend):
            step = jax.jit(jax.vmap(env.step)).trace(batch, action)
        return step.lower(lowering_platforms=(platform,)).as_text(debug_info=False)

    on_cpu = program(mjx_cpu, jax.eval_shape(jax.vmap(mjx_cpu.reset), keys), "cpu", "cpu")
    # one conditional: the loop's trip over a chunk of done envs, skipped past the last
    assert "optimization_barrier" not in on_cpu and on_cpu.count("stablehlo.case") == 1
    # On a GPU: no conditional, in a stocked step (it holds no reset)
    # or in the pool's (its refill is dense there)
    for env, state in ((mjx_gpu, stocked), (mjx_gpu, batch), (built["generalized"][1], None)):
        state = state or jax.eval_shape(jax.vmap(env.reset), keys)
        text = program(env, state, "cuda", "gpu")
        assert "optimization_barrier" not in text and "stablehlo.case" not in text


def _raw(x):
    x = x if hasattr(x, "dtype") else np.asarray(x)
    return np.asarray(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x)


def test_ppo_trains_identically_with_the_stock():
    """The stock through the trainer, which stocks each env with unroll_length fresh
    states refilled before each rollout: a GRU agent, trials of 2 short episodes, new
    ranges between segments (set_ranges must empty the stock): parameters, metrics and
    env states equal those of the loop. With XLA's current CPU emitters, in a process of
    its own: with the older emitters tests/conftest.py sets, the two training programs
    (one resets inside its steps, the other before them) fuse the agent's operations
    differently and part by 6e-11 after 6 iterations. The pool, which resets inside the
    env's step as the loop does, is checked against the loop on env states
    (test_strategies_agree_on_env_states) and through PPO's checkpoints
    (tests/test_ppo.py); its arm here cost 16 s of the suite (2026-12-06)."""
    out = with_xla_defaults("test_autoreset", "_ppo_stock_against_loop()")
    assert out == "[]", out


def _ppo_stock_against_loop() -> list[str]:
    """The paths at which the stock's training differs from the loop's (timings aside)."""
    from metarl.agents import ppo

    space = C.ContextSpace({"gravity": C.Scale(0.5, 1.5)})
    config = ppo.PPOConfig(
        num_envs=8, unroll_length=8, num_minibatches=2, core="gru", hidden_size=16,
        policy_hidden=(16,), value_hidden=(16,),
    )  # fmt: skip
    results = {}
    for strategy in ("loop", "stock"):
        env = make_contextual(
            "inverted_pendulum",
            space,
            backend="generalized",
            episode_length=6,
            episodes_per_trial=2,
            reset_strategy=strategy,
        )
        train = ppo.make_train_space(env, config)
        ts = ppo.init_training_state(train, jax.random.key(0))
        es = ppo.init_env_state(train, jax.random.key(1))
        ts, es, m1 = ppo.run_train(train, ts, es, 256)
        narrow = C.ContextSpace({"gravity": C.Scale(1.9, 2.0)})
        ts, es, m2 = ppo.run_train(train, ts, es, 256, context=narrow)
        info = {k: v for k, v in es.env.info.items() if k != "reset_pool"}
        results[strategy] = (ts.params, es.env.replace(info=info), m1, m2)
    assert float(results["loop"][2]["episodes"]) > 0
    differ = []
    for (path, a), (_, b) in zip(
        jax.tree_util.tree_leaves_with_path(results["stock"]),
        jax.tree_util.tree_leaves_with_path(results["loop"]),
        strict=True,
    ):
        name = jax.tree_util.keystr(path)
        if not any(t in name for t in ("seconds", "per_sec")):  # timings
            differ += [] if np.array_equal(_raw(a), _raw(b)) else [name]
    return differ


def test_set_ranges_empties_the_pool():
    space = C.ContextSpace({"gravity": C.Scale(0.5, 1.5)})
    env = make_contextual(
        "inverted_pendulum", space, backend="generalized", episode_length=2, reset_strategy="pool"
    )
    step = jax.jit(jax.vmap(env.step))
    fresh = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.key(0), 4))
    ahead = step(fresh, jnp.zeros((4, env.action_size)))
    state = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), ahead, fresh)
    # the 4 envs ahead end their episode: the pool is filled for all 8, they use theirs
    state = step(state, jnp.zeros((8, env.action_size)))
    np.testing.assert_array_equal(state.info["reset_pool"].ready, [False] * 4 + [True] * 4)
    state = jax.vmap(env.set_ranges, in_axes=(0, None))(state, space.scaled(0.5))
    assert not np.asarray(state.info["reset_pool"].ready).any()


def test_refill_stocks_computes_whole_chunks_for_the_envs_that_hold_the_fewest():
    """`refill_stocks(env, states, steps)`: each env ends with at least `steps` fresh
    states; the deficit is computed in whole chunks of num_envs, the room left raising
    the envs that hold the fewest; nothing where every env holds enough. The entries it
    computes are those of a full refill; the others it leaves alone."""
    space = C.ContextSpace({"gravity": C.Scale(0.5, 1.5)})
    env = make_contextual(
        "inverted_pendulum", space, backend="generalized", episode_length=3, reset_strategy="stock"
    )
    n, depth = 4, 8
    state = jax.vmap(lambda s: env.stock(s, depth))(
        jax.vmap(env.reset)(jax.random.split(jax.random.key(0), n))
    )
    step = jax.jit(jax.vmap(env.step))
    state = jax.jit(jax.vmap(env.refill))(state)
    for _ in range(5):  # resets happen: the ring's slots no longer start at 0
        state = step(state, jnp.zeros((n, env.action_size)))
    full = jax.jit(jax.vmap(env.refill))(state)
    resets = np.asarray(state.info["trial"].resets)
    assert resets.min() > 0
    ahead = (np.arange(depth)[None] - resets[:, None]) % depth  # [n, depth]: resets ahead

    def holding(held):  # the stock holding `held` fresh states per env, the rest NaN
        stock = state.info["reset_pool"]

        def spoil(x):
            if not np.issubdtype(x.dtype, np.floating):
                return x
            gone = (ahead >= np.asarray(held)[:, None]).reshape(ahead.shape + (1,) * (x.ndim - 2))
            return jnp.where(gone, jnp.nan, x)

        stock = stock.replace(
            entries=jax.tree.map(spoil, full.info["reset_pool"].entries),
            base=jnp.asarray(resets - depth + np.asarray(held), jnp.int32),
        )
        return state.replace(info={**state.info, "reset_pool": stock})

    refill = jax.jit(refill_stocks, static_argnums=(0, 2))
    for held, steps, want in (
        ([8, 6, 3, 0], 2, [8, 6, 4, 3]),  # deficit 2, one chunk of 4: levels 3, then +1
        ([8, 6, 3, 1], 4, [8, 6, 4, 4]),  # deficit 4: one chunk, no room left
        ([2, 2, 1, 0], 3, [4, 3, 3, 3]),  # deficit 7: two chunks of 4, level 3 and +1
        ([5, 6, 3, 7], 3, [5, 6, 3, 7]),  # every env holds 3: nothing
        ([0, 0, 0, 0], 8, [8, 8, 8, 8]),  # after set_ranges: the whole stock
    ):
        out = refill(env, holding(held), steps)
        got = np.asarray(jax.vmap(env.stock_left)(out))
        np.testing.assert_array_equal(got, want, err_msg=f"held {held}, steps {steps}")
        for a, b in zip(
            jax.tree.leaves(out.info["reset_pool"].entries),
            jax.tree.leaves(full.info["reset_pool"].entries),
            strict=True,
        ):
            if not np.issubdtype(a.dtype, np.floating):
                continue
            a, b = np.asarray(a), np.asarray(b)
            kept = ahead < np.asarray(want)[:, None]
            np.testing.assert_allclose(a[kept], b[kept], rtol=0, atol=1e-6)
            assert np.isnan(a[~kept]).all(), f"held {held}: computed more than its chunks"
    with pytest.raises(ValueError, match=r"steps must be an int in 1..8"):
        refill_stocks(env, state, 9)


@pytest.mark.parametrize("strategy", ["stock", "pool"])
def test_set_ranges_drops_the_fresh_states_of_the_envs_whose_ranges_changed(strategy):
    """Per-env ranges (ADR) changed for envs 0 and 2 only: their stocked (or pooled)
    fresh states were drawn from the old ranges and are dropped; envs 1 and 3 keep
    theirs, which the next refill does not compute again."""
    space = C.ContextSpace({"gravity": C.Scale(0.5, 1.5)})
    env = make_contextual(
        "inverted_pendulum", space, backend="generalized", reset_strategy=strategy
    )
    n = 4
    state = jax.vmap(env.reset)(jax.random.split(jax.random.key(0), n))
    if strategy == "stock":
        state = jax.jit(jax.vmap(env.refill))(jax.vmap(lambda s: env.stock(s, 4))(state))
    else:  # a pool starts empty: as if every env's next fresh state were computed
        pool = state.info["reset_pool"]
        pool = pool.replace(ready=jnp.ones_like(pool.ready))
        state = state.replace(info={**state.info, "reset_pool": pool})
    changed = np.array([True, False, True, False])  # envs 0 and 2
    rows = jax.tree.map(
        lambda x, y: np.where(changed.reshape((n,) + (1,) * (np.ndim(x) - 1)), y, x),
        jax.tree.map(lambda x: np.stack([x] * n), space),
        jax.tree.map(lambda x: np.stack([x] * n), space.scaled(0.5)),
    )
    out = jax.vmap(env.set_ranges)(state, C.PerEnv(rows))
    np.testing.assert_array_equal(out.info["trial"].current_ranges, [0, 1, 0, 1])
    if strategy == "stock":
        np.testing.assert_array_equal(jax.vmap(env.stock_left)(out), [0, 4, 0, 4])
    else:
        np.testing.assert_array_equal(out.info["reset_pool"].ready, [False, True, False, True])


def test_a_stocked_step_never_resets_and_an_empty_stock_is_flagged():
    """The stock's step takes its fresh state and traces no reset; a done env whose
    stock was used up (no refill) sets `overrun`, and run_train refuses such a state."""
    from metarl.agents import ppo

    space = C.ContextSpace({"gravity": C.Scale(0.5, 1.5)})
    env = make_contextual(
        "inverted_pendulum", space, backend="generalized", episode_length=1, reset_strategy="stock"
    )
    state = jax.vmap(lambda s: env.stock(s, 2))(
        jax.vmap(env.reset)(jax.random.split(jax.random.key(0), 4))
    )
    resets = []
    with mock.patch.object(env._env, "reset", side_effect=lambda *a: resets.append(1)):  # noqa: SLF001
        jax.eval_shape(jax.vmap(env.step), state, jnp.zeros((4, env.action_size)))
    assert resets == []
    state = jax.jit(jax.vmap(env.refill))(state)
    step = jax.jit(jax.vmap(env.step))
    for expected in (False, False, True):  # episodes of one step: two entries, three resets
        state = step(state, jnp.zeros((4, env.action_size)))
        assert np.asarray(state.info["reset_pool"].overrun).all() == expected
    with pytest.raises(ValueError, match='needs reset_strategy="stock"'):
        make_contextual("inverted_pendulum", space, reset_strategy="loop").stock(state, 2)

    config = ppo.PPOConfig(num_envs=4, unroll_length=2, num_minibatches=1)
    train = ppo.make_train_space(env, config)
    es = ppo.init_env_state(train, jax.random.key(1))
    pool = es.env.info["reset_pool"]
    es = es.replace(
        env=es.env.replace(
            info={**es.env.info, "reset_pool": pool.replace(overrun=pool.overrun.at[0].set(True))}
        )
    )
    with pytest.raises(RuntimeError, match="stock of fresh states empty"):
        ppo.run_train(train, ppo.init_training_state(train, jax.random.key(0)), es, 8)


def test_a_stock_entry_is_packed_into_one_array_per_dtype_and_unpacked_exactly():
    """`ResetStock.entries`: an entry's leaves flattened and joined per dtype, in leaf
    order (dtypes interleaved, scalars, an empty leaf), taken apart again bit for bit,
    also under jit and vmap; a tree of other sizes is refused."""
    from metarl.envs.contextual import _pack, _unpack

    tree = {
        "a": jnp.arange(6, dtype=jnp.float32).reshape(2, 3) / 7,
        "b": jnp.int32(-3),
        "c": jnp.array([True, False, True]),
        "d": (jnp.float32(2.5), jnp.zeros((0,), jnp.float32), jnp.arange(2, dtype=jnp.uint32)),
        "e": jnp.array([[4], [5]], jnp.int32),
    }
    packed = _pack(tree)
    assert {k: v.shape for k, v in packed.items()} == {
        "float32": (7,),
        "int32": (3,),
        "bool": (3,),
        "uint32": (2,),
    }
    np.testing.assert_array_equal(packed["int32"], [-3, 4, 5])
    for got in (
        _unpack(packed, tree),
        jax.jit(lambda p: _unpack(p, tree))(packed),
        jax.vmap(lambda p: _unpack(p, tree))(jax.tree.map(lambda x: jnp.stack([x, x]), packed)),
    ):
        for g, want in zip(jax.tree.leaves(got), jax.tree.leaves(tree), strict=True):
            g = g if g.shape == want.shape else g[1]
            assert g.dtype == want.dtype and g.shape == want.shape
            np.testing.assert_array_equal(g, want)
    with pytest.raises(ValueError, match="made by another env"):
        _unpack(packed, {**tree, "f": jnp.float32(0)})


class _EpisodeInInfo:
    """A puck whose episode keeps a target and a step counter in its own `info`
    (as Playground's manipulation and joystick tasks do) and whose step reads its
    own observation (as an env that keeps an observation history does)."""

    def __new__(cls):
        from metarl.envs.toy import Puck

        class EpisodeInInfo(Puck):
            def reset(self, rng):
                s = super().reset(rng)
                target = jax.random.uniform(jax.random.fold_in(rng, 7), ())
                return s.replace(
                    obs=jnp.concatenate([s.obs, jnp.stack([target, 0.0])]),
                    info={"target": target, "count": jnp.zeros(())},
                )

            def step(self, state, action):
                # its own observation: 6 numbers of the puck, its target, its count
                assert state.obs.shape == (8,), state.obs.shape
                s = super().step(state.replace(obs=state.obs[:6]), action)
                info = {**state.info, "count": state.info["count"] + 1}
                extra = jnp.stack([info["target"], info["count"]])
                return s.replace(
                    obs=jnp.concatenate([s.obs, extra]), info=info, reward=info["target"]
                )

        return EpisodeInInfo()


def test_an_auto_reset_restarts_the_envs_own_info_and_steps_it_on_its_own_obs():
    space = C.ContextSpace({"gravity": C.Scale(0.5, 1.5)})
    n, steps, rollouts = 4, 8, {}
    # the CPU's two defaults (stateless and pooled); the strategies agree on a whole
    # env state, info included (test_strategies_agree_on_env_states)
    for strategy in ("loop", "pool"):
        env = make_contextual(
            _EpisodeInInfo(),
            space,
            episode_length=3,
            visible_context=True,
            reset_strategy=strategy,
        )

        def run(key, env=env):
            state = jax.vmap(env.reset)(jax.random.split(key, n))
            a = jnp.zeros((n, env.action_size))

            def body(state, _):
                state = jax.vmap(env.step)(state, a)
                info = state.info
                return state, (state.obs, info["target"], info["count"], state.reward, state.done)

            return jax.lax.scan(body, state, None, length=steps)[1]

        rollouts[strategy] = jax.jit(run)(jax.random.key(0))
    obs, target, count, reward, done = (np.asarray(x) for x in rollouts["loop"])
    assert done.sum() == 2 * n  # episodes of 3 steps: done at steps 3 and 6
    # the counter restarts with every episode; the observation shows the info's target
    np.testing.assert_array_equal(count, np.tile([1, 2, 0, 1, 2, 0, 1, 2], (n, 1)).T)
    np.testing.assert_array_equal(obs[..., 6], target)
    # a new episode (from the state after a done step on) has a new target, and
    # every transition is rewarded with the target of the state it started from
    assert np.all(target[2] != target[1]) and np.all(target[5] != target[4])
    assert np.all(target[1] == target[0]) and np.all(target[4] == target[3])
    np.testing.assert_array_equal(reward[1:], target[:-1])
    # the info, rewards and ends bit for bit; the physics to float rounding (each
    # strategy's program is compiled apart: values near 0 differed by 1e-16)
    for strategy, (o, *rest) in rollouts.items():
        np.testing.assert_allclose(np.asarray(o), obs, rtol=1e-6, atol=1e-9, err_msg=strategy)
        for a, b in zip(rest, (target, count, reward, done), strict=True):
            np.testing.assert_array_equal(np.asarray(a), b, err_msg=strategy)


@pytest.mark.parametrize("strategy", ["loop", "stock"])
def test_a_program_that_resets_and_steps_traces_the_envs_reset_once(strategy):
    """`reset` and every reset a `step` may make share one trace of an episode's
    first state (the wrapped env's reset, the draw, its derived constants): the
    wrapped env's reset was traced twice in every such program."""
    space = C.ContextSpace({"gravity": C.Scale(0.5, 1.5), "mass": C.Scale(0.7, 1.3)})
    env = make_contextual("inverted_pendulum", space, reset_strategy=strategy)
    traced = []
    reset = env._env.reset  # noqa: SLF001

    def counting(*args):
        traced.append(1)
        return reset(*args)

    with mock.patch.object(env._env, "reset", counting):  # noqa: SLF001

        def run(keys):
            state = jax.vmap(env.reset)(keys)
            return jax.vmap(env.step)(state, jnp.zeros((keys.shape[0], env.action_size)))

        jax.jit(run).trace(jax.random.split(jax.random.key(0), 2))
    assert len(traced) == 1
