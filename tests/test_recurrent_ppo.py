"""Recurrent PPO is right: the learner sees what the rollout saw.

For every core (mlp, gru, lstm), with and without `reset_every_episode`, on
trials of 3 episodes that end by termination or truncation:
- the learner's recomputed log-probs and values over each sequence equal the
  rollout's and the critic's (ratio 1, approx_kl 0) on the first minibatch of
  the first epoch, and equal a step-by-step reference that zeroes the cores by
  hand exactly where a trial (or episode) starts;
- advantages equal a plain NumPy GAE over those reference values;
- GAE alone matches NumPy on random data;
- evaluation leaves the observation statistics and training untouched.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from brax.training.acme import running_statistics
from flax import linen as nn

from metarl import contexts as C
from metarl import evaluation as E
from metarl.agents import losses, networks, ppo
from metarl.agents.ppo import learner
from metarl.envs import TRIAL, make_contextual

GRAVITY = C.ContextSpace({"gravity": C.Uniform(9.0, 10.5)})
EPISODES_PER_TRIAL = 3
TINY = dict(
    num_envs=16,
    unroll_length=24,
    num_minibatches=2,
    policy_hidden=(16,),
    value_hidden=(16,),
    rl2_inputs=True,
    discounting=0.9,
    gae_lambda=0.8,
)


def pendulum(episode_length=8):
    """inverted_pendulum terminates when the pole falls; short episodes truncate."""
    return make_contextual(
        "inverted_pendulum",
        GRAVITY,
        episode_length=episode_length,
        episodes_per_trial=EPISODES_PER_TRIAL,
    )


# ---- references ----
def gae_reference(reward, value, value_next, value_final, boundary, terminated, gamma, lam):
    """Plain NumPy GAE, one env and one step at a time. All inputs [T, B].

    At a boundary (end of what a return spans) the next value is 0 after a
    termination and V(final observation) after a truncation, and the advantage
    does not look further; elsewhere it is V(next observation).
    """
    horizon, batch = reward.shape
    adv = np.zeros((horizon, batch))
    for b in range(batch):
        running = 0.0
        for t in reversed(range(horizon)):
            if boundary[t, b]:
                nxt = 0.0 if terminated[t, b] else value_final[t, b]
                running = 0.0
            else:
                nxt = value_next[t, b]
            delta = reward[t, b] + gamma * nxt - value[t, b]
            running = delta + gamma * lam * running
            adv[t, b] = running
    return adv, adv + value


def starts_reference(trial, done):
    """Where each observation of an unroll starts an episode / a trial, [T + 1, B]
    (the last row: the observation after the unroll), from the env's episode
    counter before the unroll and the done flags alone."""
    new_episode = np.asarray(trial.new_episode) > 0
    new_trial = np.asarray(trial.new_trial) > 0
    episode = np.asarray(trial.episode).copy()
    episodes, trials = [], []
    for d in np.asarray(done) > 0:
        episodes.append(new_episode)
        trials.append(new_trial)
        over = d & (episode + 1 >= EPISODES_PER_TRIAL)
        episode = np.where(d, np.where(over, 0, episode + 1), episode)
        new_episode, new_trial = d, over
    episodes.append(new_episode)
    trials.append(new_trial)
    return np.stack(episodes), np.stack(trials)


def step_by_step(agent, params, normalizer, data, starts):
    """Log-probs, V(obs_t), the core after each step and V(final_obs_t), [T, B],
    acting one step at a time with the cores zeroed by hand where `starts` [T, B]
    says (the carry's own reset flags are ignored)."""

    def zero_where(start, core, fresh):
        return jax.tree.map(
            lambda c, z: jnp.where(start.reshape(start.shape + (1,) * (c.ndim - 1)), z, c),
            core,
            fresh,
        )

    def step(cores, x):
        obs, carry, raw, start, final_obs, next_carry = x
        fresh = agent.init_carry(start.shape)
        carry = carry.replace(
            policy=zero_where(start, cores[0], fresh.policy),
            value=zero_where(start, cores[1], fresh.value),
            reset=jnp.zeros_like(carry.reset),
        )
        one = lambda f: jax.vmap(lambda o, c: f(params, normalizer, o, c))  # noqa: E731
        policy_core, dist = one(agent.policy_params)(obs, carry)
        value_core, value = one(agent.value)(obs, carry)
        _, value_final = one(agent.value)(final_obs, next_carry.replace(value=value_core))
        log_prob = jax.vmap(agent.head.log_prob)(dist, raw)
        return (policy_core, value_core), (log_prob, value, value_final, value_core)

    c0 = jax.tree.map(lambda x: x[0], data.carry)
    xs = (data.obs, data.carry, data.raw_action, starts, data.final_obs, data.next_carry)
    return jax.lax.scan(step, (c0.policy, c0.value), xs)[1]


# ---- GAE on random data ----
@pytest.mark.parametrize("seed", range(3))
def test_gae_matches_numpy_on_random_data(seed):
    rng = np.random.default_rng(seed)
    shape = (40, 7)
    reward, value, value_next, value_final = (rng.normal(size=shape) for _ in range(4))
    boundary = rng.random(shape) < 0.2
    terminated = rng.random(shape) < 0.5  # only read at a boundary
    gamma, lam = 0.95, 0.9
    nxt = losses.bootstrap_values(
        *(jnp.asarray(x, jnp.float32) for x in (value_next, value_final, boundary, terminated))
    )
    adv, ret = losses.compute_gae(
        *(jnp.asarray(x, jnp.float32) for x in (reward, value, nxt, boundary)), gamma, lam
    )
    want_adv, want_ret = gae_reference(
        reward, value, value_next, value_final, boundary, terminated, gamma, lam
    )
    np.testing.assert_allclose(adv, want_adv, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-4, atol=1e-4)


# ---- the learner against the rollout, on real unrolls ----
@pytest.mark.parametrize(
    "flax_cell, cell, carry",
    [
        (nn.GRUCell(7), networks.GRU(7), lambda h: h),
        (nn.OptimizedLSTMCell(7), networks.LSTM(7), lambda h: (h[:, ::-1], h)),
    ],
    ids=["gru", "lstm"],
)
def test_cores_are_flax_cells_with_fused_gates(flax_cell, cell, carry):
    """metarl's cores have flax's parameters (names, shapes, initial values), and
    the projected sequence stepped over time gives flax's outputs."""
    x = jax.random.normal(jax.random.key(0), (12, 6, 5))  # [T, B, in]
    c0 = carry(jax.random.normal(jax.random.key(1), (6, 7)))
    params = flax_cell.init(jax.random.key(2), c0, x[0])
    ours = cell.init(jax.random.key(2), c0, x[0])
    assert jax.tree.all(jax.tree.map(np.array_equal, params, ours))
    want = jax.lax.scan(lambda c, x_t: flax_cell.apply(params, c, x_t), c0, x)[1]
    projected = cell.apply(params, x, method="project")  # the whole sequence at once
    got = jax.lax.scan(lambda c, p_t: cell.apply(params, c, p_t, method="step"), c0, projected)[1]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert np.abs(np.asarray(want[-1]) - np.asarray(jax.tree.leaves(c0)[-1])).max() > 0.1


# Each core, and each span of returns, with the gru in both (each case 8-10 s to
# compile): the reset flags and RL^2 inputs are the same code whatever the core, and
# each core's carry starts over through the same flags.
@pytest.mark.parametrize(
    "core,reset_every_episode", [("mlp", False), ("gru", False), ("gru", True), ("lstm", True)]
)
def test_learner_recomputes_the_rollout_exactly(core, reset_every_episode):
    # Returns span trials (RL^2) without per-episode resets, episodes with them.
    span = "episode" if reset_every_episode else "trial"
    config = ppo.PPOConfig(
        core=core,
        hidden_size=8 if core != "mlp" else ppo.PPOConfig.hidden_size,  # mlp: none
        reset_every_episode=reset_every_episode,
        returns_span=span,
        **TINY,
    )
    env = pendulum()
    space = ppo.make_train_space(env, config)
    agent = space.agent
    ts = ppo.init_training_state(space, jax.random.key(0))
    es = ppo.init_env_state(space, jax.random.key(1))
    collect = jax.jit(lambda ts, es: learner.collect(env, agent, config, ts, es))
    recompute = jax.jit(lambda ts, data: learner.recompute(agent, ts.params, ts.normalizer, data))

    # A first unroll, as an iteration ends it: the second starts mid-trial from
    # a carried core, under observation statistics that are not the identity.
    es, first = collect(ts, es)
    es = es.replace(carry=es.carry.replace(value=first.value_core))
    ts = ts.replace(normalizer=running_statistics.update(ts.normalizer, first.data.obs))
    before = es
    es, batch = collect(ts, es)
    data = batch.data

    # Reset flags: exactly at trial starts (episode starts with reset_every_episode).
    episodes, trials = starts_reference(before.env.info[TRIAL], data.done)
    starts = episodes if reset_every_episode else trials
    np.testing.assert_array_equal(np.asarray(data.carry.reset) > 0, starts[:-1])
    np.testing.assert_array_equal(np.asarray(es.carry.reset) > 0, starts[-1])
    np.testing.assert_array_equal(np.asarray(data.carry.new_episode) > 0, episodes[:-1])
    assert trials[1:].any() and (episodes & ~trials).any(), "no trial or episode start to check"
    assert not starts[0].all(), "every sequence starts fresh: carried cores untested"
    # The RL^2 inputs start over with the cores: nothing of the episode (or trial)
    # before leaks in (reset every episode, the last action once gave the motor away).
    reset = np.asarray(data.carry.reset) > 0
    np.testing.assert_array_equal(np.asarray(data.carry.prev_reward)[reset], 0)
    np.testing.assert_array_equal(np.asarray(data.carry.prev_action)[reset], 0)
    assert (np.asarray(data.carry.prev_reward)[~reset] != 0).all()

    # What a finished episode is bootstrapped from: the observation it ended on
    # (the next one where it goes on), seen with the inputs the next step has.
    done = np.asarray(data.done) > 0
    following = lambda x, last: np.concatenate([x[1:], last[None]])  # noqa: E731
    obs_next = following(np.asarray(data.obs), np.asarray(es.env.obs))
    np.testing.assert_array_equal(np.asarray(data.final_obs)[~done], obs_next[~done])
    assert (~np.isclose(np.asarray(data.final_obs)[done], obs_next[done])).any(-1).all()
    for field in ("prev_action", "prev_reward", "new_episode"):
        seen = following(np.asarray(getattr(data.carry, field)), getattr(es.carry, field))
        np.testing.assert_array_equal(
            np.asarray(getattr(data.next_carry, field))[~done], seen[~done]
        )
    np.testing.assert_array_equal(data.next_carry.new_episode, 0)
    np.testing.assert_array_equal(data.next_carry.prev_reward, data.reward)

    # First minibatch of the first epoch: the learner's log-probs and values.
    _, log_prob, value = recompute(ts, data)
    np.testing.assert_allclose(log_prob, data.log_prob, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(value, batch.values, rtol=1e-5, atol=1e-5)
    terms = losses.ppo_losses(
        log_prob, data.log_prob, batch.advantages, value, batch.returns, 0 * value, 0.2
    )
    assert abs(float(terms["approx_kl"])) < 1e-6 and float(terms["clip_fraction"]) == 0.0

    # ... and a step-by-step reference that zeroes the cores by hand at `starts`.
    ref_log_prob, ref_value, ref_final, ref_core = jax.jit(
        lambda p, n, d, s: step_by_step(agent, p, n, d, s)
    )(ts.params, ts.normalizer, data, jnp.asarray(starts[:-1]))
    np.testing.assert_allclose(data.log_prob, ref_log_prob, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(batch.values, ref_value, rtol=1e-5, atol=1e-5)
    if core != "mlp":  # the carried core matters: zeroing it at t = 0 changes log-probs
        zeroed = data.replace(carry=data.carry.replace(reset=data.carry.reset.at[0].set(1.0)))
        changed = recompute(ts, zeroed)[1]
        assert np.abs(np.asarray(changed) - data.log_prob).max() > 1e-4

    # Advantages: NumPy GAE over the reference values, bootstrapping truncations
    # from V(final_obs) and never terminations.
    last_core = jax.tree.map(lambda x: x[-1], ref_core)
    _, last_value = jax.vmap(lambda o, c: agent.value(ts.params, ts.normalizer, o, c))(
        es.env.obs, es.carry.replace(value=last_core)
    )
    value_next = np.concatenate([ref_value[1:], last_value[None]])
    terminated, boundary = np.asarray(data.terminated) > 0, np.asarray(data.boundary) > 0
    assert (boundary & ~terminated).any(), "no truncation at a boundary to check"
    assert (np.asarray(data.done) * terminated).any(), "no termination to check"
    want_adv, want_ret = gae_reference(
        np.asarray(data.reward),
        np.asarray(ref_value),
        value_next,
        np.asarray(ref_final),
        boundary,
        terminated,
        config.discounting,
        config.gae_lambda,
    )
    np.testing.assert_allclose(batch.advantages, want_adv, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(batch.returns, want_ret, rtol=1e-4, atol=1e-4)


# ---- the compiled iteration, and evaluation ----
@pytest.fixture(scope="module")
def trained():
    """A GRU RL^2 agent after one iteration of one epoch of one minibatch: the
    reported PPO terms are those of the first minibatch of the first epoch."""
    config = ppo.PPOConfig(
        core="gru", hidden_size=8, **{**TINY, "num_minibatches": 1}, num_updates_per_batch=1
    )
    env = pendulum()
    space = ppo.make_train_space(env, config)
    ts = ppo.init_training_state(space, jax.random.key(0))
    es = ppo.init_env_state(space, jax.random.key(1))
    ts, es, metrics = ppo.run_train(space, ts, es, config.batch_size)
    return space, ts, es, metrics


def copy(tree):
    return jax.tree.map(jnp.copy, tree)  # run_train consumes (donates) its inputs


def test_first_minibatch_ratio_is_one_in_the_compiled_iteration(trained):
    space, ts, es, first = trained
    # The first iteration changes the observation statistics the most (from the
    # identity); the next one starts from a carried core and trained parameters.
    _, _, second = ppo.run_train(space, *copy((ts, es)), space.config.batch_size)
    for metrics in (first, second):
        assert abs(metrics["approx_kl"]) < 1e-7, metrics["approx_kl"]
        assert metrics["clip_fraction"] == 0.0


def test_evaluation_does_not_update_observation_statistics(trained):
    space, ts, es, _ = trained
    config = space.config
    assert int(ts.normalizer.count) == config.batch_size  # training observations only
    evaluator = E.Evaluator(space.env, episodes=EPISODES_PER_TRIAL, max_contexts=2)
    policy = ppo.make_policy(space, ts)
    statistics = copy(policy.normalizer)

    a_ts, a_es, _ = ppo.run_train(space, *copy((ts, es)), config.batch_size)
    evaluator.evaluate(policy, E.in_distribution(GRAVITY, 2), jax.random.key(3))
    a_ts, a_es, _ = ppo.run_train(space, a_ts, a_es, config.batch_size)
    b_ts, b_es, _ = ppo.run_train(space, *copy((ts, es)), 2 * config.batch_size)

    for got, want in zip(jax.tree.leaves(policy.normalizer), jax.tree.leaves(statistics)):
        np.testing.assert_array_equal(got, want)
    assert int(a_ts.normalizer.count) == 3 * config.batch_size
    for got, want in zip(jax.tree.leaves((a_ts, a_es)), jax.tree.leaves((b_ts, b_es))):
        if jnp.issubdtype(got.dtype, jax.dtypes.prng_key):
            got, want = jax.random.key_data(got), jax.random.key_data(want)
        np.testing.assert_array_equal(got, want)


def test_an_observation_constant_in_the_first_batch_reaches_the_networks_bounded():
    """A dimension constant in the first batch (the puck's spin while the ball falls)
    gets the statistics' floor of 1e-6 as its std: its first nonzero value, 0.1,
    would reach the networks as 1e5. Normalised inputs are clipped to +-OBS_CLIP;
    values inside pass unchanged."""
    from metarl.agents.agent import OBS_CLIP
    from metarl.agents.ppo.training import _agent

    env = make_contextual("puck", GRAVITY)
    agent = _agent(env, ppo.PPOConfig(core="gru", hidden_size=8, **TINY))  # with RL^2 inputs
    first = jnp.stack([jnp.linspace(-1.0, 1.0, 16)] * 5 + [jnp.zeros(16)], -1)  # [16, 6]
    stats = running_statistics.update(
        running_statistics.init_state(jnp.zeros(6, jnp.float32)), first
    )
    assert float(stats.std[5]) == pytest.approx(1e-6)
    obs = jnp.array([[0.5, -0.5, 0.0, 0.25, 1.0, 0.1]])
    actor, critic = agent.inputs(stats, obs, agent.init_carry((1,)))
    inside = (obs[0, :5] - stats.mean[:5]) / stats.std[:5]
    np.testing.assert_array_equal(actor[0, :5], inside)
    assert float(actor[0, 5]) == float(critic[0, 5]) == OBS_CLIP  # not 0.1 / 1e-6


def test_a_policy_run_by_hand_keeps_its_memory_and_survives_more_training():
    """`action, carry = policy(obs, carry)` left the core's reset flag at 1 until
    `observe` cleared it: a loop without `observe` wiped a GRU's memory before every
    step. Within an episode the memory now runs on as with `observe`. A policy built
    before `run_train` (which consumes its state) still acts, and a state of another
    space is refused."""
    env = make_contextual("inverted_pendulum", GRAVITY, episode_length=50)
    config = ppo.PPOConfig(core="gru", hidden_size=8, **{**TINY, "rl2_inputs": False})
    space = ppo.make_train_space(env, config)
    ts = ppo.init_training_state(space, jax.random.key(0))
    es = ppo.init_env_state(space, jax.random.key(1))
    ts, es, _ = ppo.run_train(space, ts, es, config.batch_size)
    policy = ppo.make_policy(space, ts)
    act, observe = jax.jit(lambda p, o, c: p(o, c)), jax.jit(lambda p, c, a, s: p.observe(c, a, s))
    step = jax.jit(jax.vmap(env.step))

    def run(policy, observed, fresh=False, steps=3):
        state = jax.vmap(env.reset)(jax.random.split(jax.random.key(7), 4))
        carry, actions = policy.init_carry(4), []
        for _ in range(steps):
            action, carry = act(policy, state.obs, policy.init_carry(4) if fresh else carry)
            state = step(state, action)
            carry = observe(policy, carry, action, state) if observed else carry
            actions.append(np.asarray(action))
        assert not np.asarray(state.info[TRIAL].new_episode).any()  # one episode each
        return np.stack(actions)

    with_observe = run(policy, True)
    np.testing.assert_array_equal(run(policy, False), with_observe)
    assert np.abs(run(policy, False, fresh=True) - with_observe).max() > 1e-3  # memory matters
    ppo.run_train(space, ts, es, config.batch_size)  # consumes ts
    np.testing.assert_array_equal(run(policy, True), with_observe)
    other = ppo.make_train_space(env, dataclasses.replace(config, core="lstm"))
    with pytest.raises(ValueError, match="does not match this train space"):
        ppo.make_policy(other, ppo.init_training_state(space, jax.random.key(0)))
