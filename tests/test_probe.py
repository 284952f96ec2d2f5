"""metarl.probe: the memory it records is the agent's, in the contexts asked for,
and the probe decodes a context a memory holds and not one it does not."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metarl import contexts as C
from metarl import evaluation as E
from metarl import probe as P
from metarl.agents import ppo
from metarl.compilation import count_compilations
from metarl.envs import make_contextual

TARGET = C.ContextSpace({"actuator_gain": C.Choice([-1.0, -0.5, 0.5, 1.0], relative=True)})
EPISODE = 10


def _config(core: str) -> ppo.PPOConfig:
    recurrent = {"rl2_inputs": True, "hidden_size": 8} if core != "mlp" else {}
    return ppo.PPOConfig(
        core=core,
        num_envs=4,
        unroll_length=4,
        num_minibatches=2,
        policy_hidden=(8,),
        value_hidden=(8,),
        **recurrent,
    )


@pytest.fixture(scope="module")
def env():
    return make_contextual(
        "puck", TARGET, episode_length=EPISODE, episodes_per_trial=2, velocity_in_obs=False
    )


@pytest.fixture(scope="module")
def policy(env):
    return _policy(env, "gru")


@pytest.fixture(scope="module")
def evaluator(env):
    return E.Evaluator(env, episodes=4, max_contexts=4)  # 2 trials per context


def _gains(*values) -> E.ContextSet:
    return E.ContextSet("chosen", {"actuator_gain": np.asarray(values, np.float32)})


def test_the_recorded_memory_is_the_agents_in_the_contexts_asked_for(env, policy, evaluator):
    key = jax.random.key(3)
    push = P.record_memory(evaluator, policy, _gains(1.0, 0.5, -0.5), key)
    pull = P.record_memory(evaluator, policy, _gains(-1.0, -1.0, -1.0), key)
    # envs 2i, 2i + 1 run context i (the padding's fourth context is left out)
    assert push.features.shape == (6, 2 * EPISODE, 8)
    np.testing.assert_array_equal(push.targets[:, 0], [1.0, 1.0, 0.5, 0.5, -0.5, -0.5])
    np.testing.assert_array_equal(push.context, [0, 0, 1, 1, 2, 2])
    assert push.names == ("actuator_gain",)
    # the puck never ends early: two episodes of EPISODE steps, then nothing
    np.testing.assert_array_equal(push.episode, np.repeat([[0, 1]], EPISODE, axis=1).repeat(6, 0))
    # the same reset keys: the first observation, and so the memory after it, is the
    # same whatever the motor; from the second step on the motor's push shows in it
    np.testing.assert_array_equal(push.features[:, 0], pull.features[:, 0])
    assert not np.allclose(push.features[:, 2:], pull.features[:, 2:])
    # it is the policy's core state: after the first step, the GRU's from zero
    ranges, _ = evaluator.ranges(_gains(1.0, 0.5, -0.5))
    state = jax.vmap(env.reset)(jax.random.split(key, 8), ranges)
    _, carry = policy(state.obs, policy.init_carry(8))
    np.testing.assert_allclose(push.features[:, 0], np.asarray(carry.policy)[:6], rtol=1e-6)
    # another evaluator of the env that runs batches of the same size (a probe's fit set
    # beside the evaluation's) records with the same program: nothing compiles
    other = E.Evaluator(env, episodes=2, max_contexts=8)  # a trial per context: 8 envs
    with count_compilations() as compiles:
        again = P.record_memory(other, policy, _gains(1.0, 0.5, -0.5), key)
    assert compiles.count == 0
    np.testing.assert_array_equal(again.targets[:, 0], [1.0, 0.5, -0.5])


def _policy(env, core: str):
    space = ppo.make_train_space(env, _config(core))
    return ppo.make_policy(space, ppo.init_training_state(space, jax.random.key(0)))


def test_an_lstm_memory_is_both_its_states_and_a_feed_forward_agent_has_none(env, evaluator):
    lstm = _policy(env, "lstm")
    memory = P.record_memory(evaluator, lstm, _gains(1.0, -1.0), jax.random.key(0))
    assert memory.features.shape == (4, 2 * EPISODE, 16)  # (c, h) of 8 units each
    ranges, _ = evaluator.ranges(_gains(1.0, -1.0))
    state = jax.vmap(env.reset)(jax.random.split(jax.random.key(0), 8), ranges)
    _, carry = lstm(state.obs, lstm.init_carry(8))
    first = np.concatenate([np.asarray(x)[:4] for x in jax.tree.leaves(carry.policy)], -1)
    np.testing.assert_allclose(memory.features[:, 0], first, rtol=1e-6)
    with pytest.raises(ValueError, match="core is 'mlp', which keeps no memory"):
        P.record_memory(evaluator, _policy(env, "mlp"), _gains(1.0), jax.random.key(0))


def _memory(features, targets, episodes=2) -> P.Memory:
    n, t, _ = features.shape
    return P.Memory(
        split="synthetic",
        features=features,
        episode=np.repeat(np.arange(episodes), t // episodes)[None].repeat(n, 0),
        targets=targets,
        names=("a", "b"),
        context=np.arange(n),
        episodes_per_trial=episodes,
    )


def _synthetic(seed: int, informative: bool) -> P.Memory:
    """Memories of 6 units over 8 steps: from step 2 on, two units hold the context
    `a` (if `informative`); `b` never varies; the rest is noise."""
    rng = np.random.default_rng(seed)
    n, t = 64, 8
    a = rng.choice([-1.0, -0.5, 0.5, 1.0], n)
    features = rng.normal(size=(n, t, 6))
    if informative:
        features[:, 2:, 0] += 3.0 * a[:, None]
        features[:, 2:, 1] -= 2.0 * a[:, None]
    return _memory(features, np.stack([a, np.full(n, 2.0)], -1))


def test_the_probe_decodes_a_context_the_memory_holds_and_not_one_it_does_not():
    probe = P.fit_probe(_synthetic(0, True))
    assert probe.names == ("a",)  # `b` does not vary: nothing to decode
    # the memory moves with `a` by 3 and -2 in units 0 and 1, from step 2 of 8 on
    np.testing.assert_allclose(probe.encoding[0], [2.25, -1.5, 0, 0, 0, 0], atol=0.2)
    score = P.score_probe(probe, _synthetic(1, True))
    assert score.by_episode[1] > 0.8 and score.error_by_episode[1, 0] < 0.3
    assert abs(score.by_step[0]) < 0.2 and score.by_step[3] > 0.8  # nothing known at first
    blind = P.score_probe(P.fit_probe(_synthetic(0, False)), _synthetic(1, False))
    assert blind.r2 < 0.1 and blind.by_episode[1] < 0.1
    with pytest.raises(ValueError, match="no context varies"):
        P.fit_probe(_memory(np.zeros((4, 4, 3)), np.ones((4, 2))))
    other = P.Memory(**{**vars(_synthetic(1, True)), "names": ("c", "d")})
    with pytest.raises(ValueError, match="not those the probe was fitted on"):
        P.score_probe(probe, other)
    for ridge in (-1.0, 0.0):  # 0: singular where a unit never moves
        with pytest.raises(ValueError, match="ridge must be a finite number > 0"):
            P.fit_probe(_synthetic(0, True), ridge=ridge)
    narrow = P.Memory(**{**vars(_synthetic(1, True)), "features": np.zeros((64, 8, 5))})
    with pytest.raises(ValueError, match="holds 5 memory units; the probe reads 6"):
        P.score_probe(probe, narrow)
    for field, where in (("features", (3, 4, 0)), ("targets", (3, 0))):
        broken = _synthetic(0, True)
        values = getattr(broken, field).copy()
        values[where] = np.nan  # one number: every weight, or the check of what varies
        broken = P.Memory(**{**vars(broken), field: values})
        with pytest.raises(ValueError, match="1 non-finite"):
            P.fit_probe(broken)
        with pytest.raises(ValueError, match="1 non-finite"):
            P.score_probe(probe, broken)


def test_a_probe_fitted_on_several_recordings_is_the_probe_of_all_their_trials():
    """The runner fits on several recordings (`EvalConfig.probe` sets): the same as
    one recording of all their envs; recordings of other dimensions are refused."""
    a, b = _synthetic(0, True), _synthetic(2, True)
    both = _memory(np.concatenate([a.features, b.features]), np.concatenate([a.targets, b.targets]))
    split, joint = P.fit_probe([a, b]), P.fit_probe(both)
    np.testing.assert_allclose(split.weights, joint.weights, rtol=1e-10)
    np.testing.assert_allclose(split.mean, joint.mean, rtol=1e-12)
    assert not np.allclose(split.weights, P.fit_probe(a).weights)
    other = P.Memory(**{**vars(b), "names": ("c", "d")})
    with pytest.raises(ValueError, match="several of one env"):
        P.fit_probe([a, other])
    with pytest.raises(ValueError, match="several of one env"):
        P.fit_probe([])


def _fitted(evaluator, policy) -> P.LinearProbe:
    gains = _gains(-1.0, -0.5, 0.5, 1.0)
    return P.fit_probe(P.record_memory(evaluator, policy, gains, jax.random.key(7)))


@pytest.mark.parametrize("along", ["encoding", "readout"])
def test_a_steered_memory_decodes_the_context_asked_for_and_acts_on_it(
    env, evaluator, policy, along
):
    """The edit is the one asked for: at strength 0 the evaluation is the plain
    policy's exactly; at 1 the probe decodes the chosen context from the memory at
    every step and the episodes change; an edit along the encoding is a multiple of
    it, one along the readout the smallest; the control's leaves the readout alone."""
    probe, key = _fitted(evaluator, policy), jax.random.key(4)
    run, to = _gains(1.0, -0.5, 0.5), _gains(-1.0, -1.0, 1.0)
    plain = evaluator.evaluate(policy, run, key)
    none = P.steer(evaluator, policy, probe, run, key, to=to, along=along, strength=0.0)
    np.testing.assert_array_equal(none.returns, plain.returns)

    steered = P.steer_policy(evaluator, policy, probe, to, along=along)
    memory = P.record_memory(evaluator, steered, run, key)
    np.testing.assert_array_equal(memory.targets[:, 0], [1.0, 1.0, -0.5, -0.5, 0.5, 0.5])
    decoded = probe.predict(memory.features)[..., 0]  # [envs, steps]
    expected = np.repeat([-1.0, -1.0, 1.0], 2)[:, None]
    np.testing.assert_allclose(decoded, np.broadcast_to(expected, decoded.shape), atol=2e-4)
    # the head reads the edited memory from the first step on
    ranges, _ = evaluator.ranges(run)
    state = jax.vmap(env.reset)(jax.random.split(key, 8), ranges)
    first, _ = policy(state.obs, policy.init_carry(8))
    first_steered, _ = steered(state.obs, steered.init_carry(8))
    assert not np.allclose(first, first_steered)
    unsteered = P.record_memory(evaluator, policy, run, key)
    assert np.abs(probe.predict(unsteered.features)[..., 0] - expected).max() > 0.5
    assert not np.allclose(
        P.steer(evaluator, policy, probe, run, key, to=to, along=along).returns, plain.returns
    )
    # the envs' own contexts by default
    own_policy = P.steer_policy(evaluator, policy, probe, run, along=along)
    own = P.record_memory(evaluator, own_policy, run, key)
    own_decoded = probe.predict(own.features)[..., 0]
    np.testing.assert_allclose(
        own_decoded, own.targets[:, :1].repeat(own_decoded.shape[1], 1), atol=2e-4
    )

    # the size-matched control replays the steered run's edit sizes, env by env and
    # step by step, along a direction the readout does not see
    control = P.control_policy(evaluator, steered, run, key)
    sizes = np.asarray(control.replay)  # [T, envs]
    first_edit = memory.features[:, 0] - unsteered.features[:, 0]  # the same core state before
    np.testing.assert_allclose(np.linalg.norm(first_edit, axis=-1), sizes[0, :6], rtol=1e-4)
    assert np.all(sizes[:, :6] > 0)
    with count_compilations() as compiles:  # the steered run's programs
        controlled = P.record_memory(evaluator, control, run, key)
        evaluator.evaluate(control, run, key)
    assert compiles.count == 0
    moved = controlled.features[:, 0] - unsteered.features[:, 0]
    np.testing.assert_allclose(np.linalg.norm(moved, axis=-1), sizes[0, :6], rtol=1e-4)
    np.testing.assert_allclose(
        probe.predict(controlled.features[:, 0]), probe.predict(unsteered.features[:, 0]), atol=2e-4
    )
    features = jnp.asarray(unsteered.features[:, 3], jnp.float32)
    pad = jnp.concatenate([features, features[-2:]])  # the padding context's envs
    later = np.asarray(control.edit(pad, 3))[:6]
    np.testing.assert_allclose(
        np.linalg.norm(later - unsteered.features[:, 3], axis=-1), sizes[3, :6], rtol=1e-3
    )
    np.testing.assert_allclose(
        probe.predict(later), probe.predict(unsteered.features[:, 3]), atol=2e-4
    )
    edit = np.asarray(steered.edit(pad))[:6] - unsteered.features[:, 3]
    encoding = probe.encoding[0] / np.linalg.norm(probe.encoding[0])
    cosine = np.abs(edit @ encoding) / np.linalg.norm(edit, axis=-1)
    readout = probe.weights[:, 0] / probe.feature_scale  # the smallest edit lies along it
    smallest = np.abs(
        probe.predict(unsteered.features[:, 3])[:, 0] - np.repeat([-1.0, -1.0, 1.0], 2)
    ) / np.linalg.norm(readout)
    if along == "encoding":
        np.testing.assert_allclose(cosine, 1.0, rtol=1e-4)
        assert np.all(np.linalg.norm(edit, axis=-1) > 1.01 * smallest)
    else:
        np.testing.assert_allclose(np.linalg.norm(edit, axis=-1), smallest, rtol=1e-3)


def test_an_lstm_is_steered_in_both_its_states_and_its_head_reads_h(env, evaluator):
    lstm = _policy(env, "lstm")
    probe, key = _fitted(evaluator, lstm), jax.random.key(4)
    run, to = _gains(1.0, -0.5), _gains(-1.0, 1.0)
    steered = P.steer_policy(evaluator, lstm, probe, to)
    memory = P.record_memory(evaluator, steered, run, key)  # (c, h) of 8 units each
    decoded = probe.predict(memory.features)[..., 0]
    expected = np.repeat([-1.0, 1.0], 2)[:, None]
    np.testing.assert_allclose(decoded, np.broadcast_to(expected, decoded.shape), atol=2e-4)
    ranges, _ = evaluator.ranges(run)
    state = jax.vmap(env.reset)(jax.random.split(key, 8), ranges)
    action, carry = steered(state.obs, steered.init_carry(8))
    c, h = carry.policy
    tower = lstm.agent.towers()[0]
    dist = tower.apply(lstm.params["policy"], h, method="decode")
    head = lstm.agent.head
    np.testing.assert_allclose(action, head.postprocess(head.mode(dist)), rtol=1e-5, atol=1e-6)
    unsteered = P.record_memory(evaluator, lstm, run, key)
    assert not np.allclose(unsteered.features[:, 0, :8], np.asarray(c)[:4])  # c moved too


def test_steering_refuses_what_it_cannot_do(env, evaluator, policy):
    probe = _fitted(evaluator, policy)
    run = _gains(1.0, -0.5)
    with pytest.raises(ValueError, match="core is 'mlp', which keeps no memory to steer"):
        P.steer_policy(evaluator, _policy(env, "mlp"), probe, run)
    with pytest.raises(ValueError, match="the probe reads 8 memory units"):
        P.steer_policy(evaluator, _policy(env, "lstm"), probe, run)
    with pytest.raises(ValueError, match="runs at most 4 at once"):
        P.steer_policy(evaluator, policy, probe, _gains(*[1.0] * 5))
    with pytest.raises(ValueError, match="`to` holds 1 contexts for the 2"):
        P.steer(evaluator, policy, probe, run, jax.random.key(0), to=_gains(1.0))
    with pytest.raises(ValueError, match=r"along='probe'; choose one of \['encoding', 'readout'\]"):
        P.steer_policy(evaluator, policy, probe, run, along="probe")
    with pytest.raises(ValueError, match=r"give \['motor'\]; give a value to every name"):
        P.steer_policy(evaluator, policy, probe, E.ContextSet("x", {"motor": np.ones(2)}))
    with pytest.raises(ValueError, match="strength must be a finite number"):
        P.steer_policy(evaluator, policy, probe, run, strength=float("nan"))
    # a NaN to decode made the memory NaN, and the episode cut there scored 0
    with pytest.raises(ValueError, match=r"hold non-finite \['actuator_gain'\]"):
        P.steer_policy(evaluator, policy, probe, _gains(float("nan"), 1.0))
    # an encoding the readout barely sees: the edit to decode one unit of gain would move
    # the memory 1/cosine units (a 1 x 1 map's condition number is 1 however small it is)
    readout = probe.weights[:, 0] / probe.feature_scale
    across = np.linalg.svd(readout[None])[2][-1]  # a direction the readout does not see
    for cosine, refused in ((1e-7, True), (0.2, False)):
        encoding = across + cosine * np.linalg.norm(across) * readout / np.linalg.norm(readout)
        unseen = dataclasses.replace(probe, encoding=encoding[None])
        if refused:
            with pytest.raises(ValueError, match="the probe's readout does not see the memory's"):
                P.steer_policy(evaluator, policy, unseen, run)
        else:
            P.steer_policy(evaluator, policy, unseen, run)
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="give the steered policy .* not Policy"):
        P.control_policy(evaluator, policy, run, key)
    steered = P.steer_policy(evaluator, policy, probe, run)
    with pytest.raises(ValueError, match="SteeredPolicy holds a row per env of one batch"):
        evaluator.evaluate(steered, _gains(*[1.0] * 5), key)  # chunk 2 reused chunk 1's rows
    with pytest.raises(ValueError, match="not SteeredPolicy built by control_policy"):
        P.control_policy(evaluator, P.control_policy(evaluator, steered, run, key), run, key)
    other = E.Evaluator(env, episodes=evaluator.env.episodes_per_trial, max_contexts=2)
    with pytest.raises(ValueError, match="built for 8 envs of .* this evaluator runs 2 of"):
        P.control_policy(other, steered, run, key)


def test_one_number_per_context_sets_every_element_of_that_context():
    """A per-element entry given one number per context (as `E.grid` gives its axis,
    and `Evaluator.ranges` runs it): the steering target of context i holds that number
    at every element. Until 2026-12-07 numpy lined the contexts up with the elements: a
    set of as many contexts as elements steered context i to all the contexts' values,
    any other size failed with numpy's broadcast error."""
    space = C.ContextSpace({**TARGET, "damping[x, spin]": C.Scale(0.5, 2.0, per_element=True)})
    env = make_contextual("puck", space, episode_length=EPISODE, velocity_in_obs=False)
    for damping in ([0.6, 1.8], [0.6, 1.0, 1.8]):
        c = len(damping)
        to = E.ContextSet(
            "to", {"actuator_gain": np.ones(c), "damping[x, spin]": np.asarray(damping)}
        )
        expected = np.column_stack([np.ones(c), damping, damping]).astype(np.float32)
        np.testing.assert_array_equal(P._values(env, to), expected)
    per_element = E.ContextSet("to", {"actuator_gain": np.ones(2), "damping[x, spin]": np.eye(2)})
    np.testing.assert_array_equal(P._values(env, per_element), [[1, 1, 0], [1, 0, 1]])
    wrong = E.ContextSet("to", {"actuator_gain": np.ones(2), "damping[x, spin]": np.ones((2, 3))})
    with pytest.raises(ValueError, match=r"shape \(3,\) per context; give one number or one per"):
        P._values(env, wrong)
