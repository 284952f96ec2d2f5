"""Task contexts: a goal declared in the env's `task_params` is drawn like physics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import curricula
from metarl import contexts as C
from metarl import evaluation as E
from metarl import experiment
from metarl.agents import ppo
from metarl.envs import CONTEXT, make_contextual
from metarl.envs.goals import goal_xy

GOAL = C.ContextSpace(
    {"goal_distance": C.Uniform(0.05, 0.2), "goal_direction": C.Uniform(-3.14, 3.14)}
)


def _rollout(env, steps=20):
    """(first state, last state, summed reward) of `steps` zero actions from key 0."""

    @jax.jit
    def run(ranges):
        first = env.reset(jax.random.key(0), ranges)

        def body(s, _):
            s = env.step(s, jnp.zeros(env.action_size))
            return s, s.reward

        s, rewards = jax.lax.scan(body, first, None, steps)
        return first, s, rewards.sum()

    return run


def test_brax_goal_moves_the_target_and_what_is_rewarded():
    env = make_contextual("reacher_goal", GOAL, episode_length=100)
    run = _rollout(env)
    returns = {}
    for d in (0.05, 0.1, 0.2):
        _, s, ret = run(GOAL.pinned({"goal_distance": d, "goal_direction": 0.7}))
        target = np.asarray(s.pipeline_state.q[2:])  # the target's slide joints
        np.testing.assert_allclose(
            target, np.asarray(goal_xy({"goal_distance": d, "goal_direction": 0.7})), atol=1e-6
        )
        returns[d] = float(ret)
    assert len({round(r, 3) for r in returns.values()}) == 3
    # The arm rests near the base's reach; a goal at its reach earns more than one near the base.
    assert returns[0.2] > returns[0.05]


def test_goals_are_drawn_per_env_and_kept_in_the_state():
    env = make_contextual("reacher_goal", GOAL)
    states = jax.jit(jax.vmap(env.reset))(jax.random.split(jax.random.key(1), 8))
    d = np.asarray(states.info[CONTEXT]["goal_distance"])
    assert len(set(d.round(5))) == 8 and np.all((d >= 0.05) & (d <= 0.2))
    np.testing.assert_allclose(
        np.linalg.norm(np.asarray(states.pipeline_state.q[:, 2:]), axis=1), d, rtol=1e-5
    )


def test_unknown_task_name_lists_the_env_task_parameters():
    with pytest.raises(ValueError, match="task parameters: goal_distance, goal_direction"):
        make_contextual("reacher_goal", C.ContextSpace({"goal_radius": C.Uniform(0.1, 0.2)}))


def test_task_parameters_cannot_shadow_quantities():
    from metarl.envs.goals import ReacherGoal

    class Shadow(ReacherGoal):
        task_params = {"gravity": 1.0}
        task_periods = {}

    with pytest.raises(ValueError, match="shadow canonical quantities"):
        make_contextual(Shadow(), C.ContextSpace({"gravity": C.Uniform(5, 15)}))


@pytest.mark.parametrize(
    "periods, message",
    [
        ({"goal_angle": 6.28}, "names 'goal_angle', which is not one of its task parameters"),
        ({"goal_direction": 0.0}, "must be a finite number > 0"),
        ({"goal_direction": float("nan")}, "must be a finite number > 0"),
        ({"goal_direction": "2pi"}, "must be a finite number > 0"),
        ({"goal_turns": 4}, "declares it as int32"),
    ],
)
def test_a_bad_task_period_is_refused(periods, message):
    """A misspelt name made the angle not periodic, and a period of 0 a whole turn:
    held-out evaluation then drew training angles as extrapolation."""
    from metarl.envs.goals import ReacherGoal

    class Periodic(ReacherGoal):
        task_params = {**ReacherGoal.task_params, "goal_turns": np.int32(0)}
        task_periods = periods

    with pytest.raises(ValueError, match=message):
        make_contextual(Periodic(), GOAL)


def test_a_task_default_that_is_no_number_is_refused():
    from metarl.envs.goals import ReacherGoal

    class Moded(ReacherGoal):
        task_params = {**ReacherGoal.task_params, "mode": None}

    with pytest.raises(ValueError, match=r"task_params\['mode'\] must be a number"):
        make_contextual(Moded(), GOAL)


def test_a_periodic_task_parameter_takes_absolute_ranges_only():
    """Held-out evaluation measures the turn in the angle's units: a scale of the
    default or log space measured it wrongly (a whole turn of scales had an outside)."""
    from metarl.envs.goals import ReacherGoal

    class Turned(ReacherGoal):
        task_params = {**ReacherGoal.task_params, "goal_direction": 1.0}

    for dist, kind in (
        (C.Scale(0.5, 2.0), "relative scale"),
        (C.LogUniform(0.5, 3.0), "LogUniform"),
    ):
        space = C.ContextSpace({"goal_distance": C.Uniform(0.05, 0.2), "goal_direction": dist})
        with pytest.raises(ValueError, match=f"'goal_direction' is periodic .*not a {kind}"):
            make_contextual(Turned(), space)
    env = make_contextual("reacher_goal", GOAL)
    target = C.ContextSpace(
        {"goal_distance": C.Uniform(0.05, 0.2), "goal_direction": C.LogUniform(0.5, 3.0)}
    )
    with pytest.raises(ValueError, match="the experiment's target: context 'goal_direction'"):
        experiment.Experiment(env, target, curricula.LinearWidening(1.0, 1), ppo.PPOConfig())


def test_playground_goal_changes_the_reward():
    pytest.importorskip("mujoco_playground")
    from metarl.envs.playground_tasks import PlaygroundReacherGoal

    env = make_contextual(PlaygroundReacherGoal(), GOAL, episode_length=100)
    run = _rollout(env, steps=5)  # one program: where the episode starts, and its rewards
    # Put the goal on the fingertip: every step is rewarded; put it across: none is.
    first, _, _ = run(GOAL.pinned({"goal_distance": 0.1, "goal_direction": 0.0}))
    finger = np.asarray(first.pipeline_state.geom_xpos[env.unwrapped._finger_geom_id, :2])
    at_finger = {
        "goal_distance": float(np.linalg.norm(finger)),
        "goal_direction": float(np.arctan2(finger[1], finger[0])),
    }
    across = {**at_finger, "goal_direction": at_finger["goal_direction"] + np.pi}
    *_, near = run(GOAL.pinned(at_finger))
    *_, far = run(GOAL.pinned(across))
    assert float(near) == pytest.approx(5.0) and float(far) == 0.0
    assert run._cache_size() == 1


WEIGHTS = jnp.array([0.0, 1.0, 10.0])


def _indexed_env(space):
    """An MJCF env whose reward reads an integer index, a flag and a float goal."""
    from metarl.envs import MjcfEnv

    xml = """<mujoco><worldbody><body><joint name="x" type="slide" axis="1 0 0"/>
      <geom type="sphere" size="0.1" mass="1"/></body></worldbody>
      <actuator><motor joint="x"/></actuator></mujoco>"""
    env = MjcfEnv(
        xml,
        observe=lambda data, task: jnp.concatenate([data.qpos, data.qvel]),
        reward=lambda data, action, new, task: (
            WEIGHTS[task["idx"]] + task["goal"] + jnp.where(task["flag"], 100.0, 0.0)
        ),
        task_params={"idx": 2, "goal": 0.3, "flag": False},
    )
    return make_contextual(env, C.ContextSpace(space))


def test_held_out_splits_hold_an_index_out_only_on_values_the_env_declares():
    """The splits took an index trained on 0-2 to 1.5, 2.4 or -0.3, and a flag to 0.5:
    read rounded, every "held-out" context ran a trained one. An index is now held out
    only on the values its Choice declares with probability 0 (between its trained
    values or beyond them), and drawn as in training where it declares none; the
    evaluator refuses a value the env would read rounded."""
    idx = C.Choice([0, 1, 2, 3, 4], [0.5, 0.0, 0.5, 0.0, 0.0])
    space = {"idx": idx, "flag": C.Choice([0, 1]), "goal": C.Uniform(0.2, 0.4)}
    env, space = _indexed_env(space), C.ContextSpace(space)
    sets = {
        "interpolation": E.interpolation(space, 50, env=env),
        "low": E.extrapolation(env, space, 50, side="low"),
        "high": E.extrapolation(env, space, 50, side="high"),
        "both": E.extrapolation(env, space, 50),
    }
    held_out = {"interpolation": {1}, "low": {0, 2}, "high": {3, 4}, "both": {3, 4}}
    for split, contexts in sets.items():
        assert set(contexts.values["idx"].tolist()) == held_out[split], split
        assert set(contexts.values["flag"].tolist()) == {0, 1}, split  # nothing declared
    assert np.all(sets["low"].values["goal"] < 0.2) and np.all(sets["high"].values["goal"] > 0.4)
    exp = experiment.Experiment(env, space, curricula.LinearWidening(1.0, 1), ppo.PPOConfig())
    axis = experiment._heatmap_axes(exp)["idx"]  # noqa: SLF001 - the heatmap's cells
    np.testing.assert_array_equal(axis, [0, 1, 2, 3, 4])
    evaluator = E.Evaluator(env, episodes=1, max_contexts=2)
    for name, value, what in (("idx", 1.5, "an integer"), ("flag", 2.0, "a flag")):
        values = {"idx": [0.0, 2.0], "flag": [0.0, 1.0], "goal": [0.3, 0.3], name: [value] * 2}
        with pytest.raises(ValueError, match=f"declares {name!r} as {what}"):
            evaluator.ranges(E.ContextSet("x", {k: np.float32(v) for k, v in values.items()}))


def test_a_task_parameter_no_context_draws_keeps_its_dtype():
    """An index declared as an integer stays one (all task parameters became float32,
    and indexing with a float fails); drawn floats are float32."""
    env = _indexed_env({"goal": C.Uniform(0.1, 0.5)})
    state = env.step(env.reset(jax.random.key(0)), jnp.zeros(env.action_size))
    goal = float(state.info[CONTEXT]["goal"])
    assert 0.1 <= goal <= 0.5
    np.testing.assert_allclose(float(state.reward), 10.0 + goal, rtol=1e-6)


def test_an_integer_or_flag_task_parameter_is_drawn_as_one():
    """An index and a flag take a Choice of their own kind of values, and the env reads
    them as declared: a flag drawn in [0, 1] was read as True every time (the context
    varied, the task did not), and a Choice of indices failed inside JAX."""
    env = _indexed_env({"idx": C.Choice([0, 1, 2]), "flag": C.Choice([0, 1])})
    keys = jax.random.split(jax.random.key(0), 64)
    state = jax.vmap(env.reset)(keys)
    state = jax.vmap(env.step)(state, jnp.zeros((64, env.action_size)))
    idx, flag = (np.asarray(state.info[CONTEXT][k]) for k in ("idx", "flag"))
    assert set(idx.tolist()) == {0, 1, 2} and set(flag.tolist()) == {0, 1}
    want = np.asarray(WEIGHTS)[idx.astype(int)] + 0.3 + 100.0 * flag
    np.testing.assert_allclose(np.asarray(state.reward), want, rtol=1e-6)
    for space, kind in (
        ({"flag": C.Uniform(0.0, 1.0)}, "a flag"),
        ({"flag": C.Choice([0.0, 0.5])}, "a flag"),
        ({"idx": C.Uniform(0.0, 2.0)}, "an integer"),
        ({"idx": C.Choice([0.5, 1.5])}, "an integer"),
        ({"idx": C.Choice([1.0, 2.0], relative=True)}, "an integer"),
    ):
        with pytest.raises(ValueError, match=f"declares this task parameter as {kind}"):
            _indexed_env(space)
