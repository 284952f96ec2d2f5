"""Elements chosen by MJCF name: "mass[torso]", "friction[floor]", patterns, indices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from brax import envs as brax_envs

from metarl import contexts as C
from metarl.envs import CONTEXT, make_contextual

HOPPER = brax_envs.get_environment("hopper", backend="generalized")
ANT = brax_envs.get_environment("ant", backend="generalized")


def test_element_names_come_from_the_mjcf():
    assert C.names.element_names(HOPPER.sys, "bodies") == ["torso", "thigh", "leg", "foot"]
    assert C.names.element_names(HOPPER.sys, "geoms")[0] == "floor"
    dofs = C.names.element_names(HOPPER.sys, "dofs")
    assert dofs[3:] == ["thigh_joint", "leg_joint", "foot_joint"]
    # Hopper's motors and ant's leg bodies are unnamed: reachable by index only.
    assert C.names.element_names(HOPPER.sys, "actuators") == ["", "", ""]
    assert "" in C.names.element_names(ANT.sys, "bodies")


@pytest.mark.parametrize(
    "selector, expected",
    [("torso", [0]), ("*o*", [0, 3]), ("foot, thigh", [3, 1]), ("0, -1", [0, 3]), ("t?igh", [1])],
)
def test_selection(selector, expected):
    assert C.names.select(HOPPER.sys, "bodies", selector, "mass").tolist() == expected


def test_selection_writes_only_the_chosen_elements():
    b = C.bind(C.ContextSpace({"mass[thigh]": C.Uniform(1.0, 9.0)}), HOPPER.sys, "generalized")
    sys = b.apply({"mass[thigh]": jnp.float32(7.0)})
    before, after = np.asarray(HOPPER.sys.link.inertia.mass), np.asarray(sys.link.inertia.mass)
    assert after[1] == 7.0
    np.testing.assert_array_equal(np.delete(after, 1), np.delete(before, 1))
    # The MuJoCo copy follows (mjx reads body_mass, with the world body first).
    assert float(sys.body_mass[2]) == 7.0


def test_per_element_values_follow_the_order_the_selection_names():
    space = C.ContextSpace({"mass[thigh, torso]": C.Fixed([10.0, 1.0], per_element=True)})
    b = C.bind(space, HOPPER.sys, "generalized")
    sys = b.apply(b.sample(jax.random.key(0)))
    torso, thigh = np.asarray(sys.body_mass)[1:3]
    assert (torso, thigh) == (1.0, 10.0)
    with pytest.raises(ValueError, match=r"element shape \(2,\): thigh, torso, in this order"):
        C.bind(
            C.ContextSpace({"mass[thigh, torso]": C.Fixed([10.0, 1.0, 2.0], per_element=True)}),
            HOPPER.sys,
            "generalized",
        )


def test_per_element_selection_and_relative_scale():
    space = C.ContextSpace({"friction[*foot*, floor]": C.Scale(0.5, 2.0, per_element=True)})
    b = C.bind(space, HOPPER.sys, "generalized")
    assert b.entries[0].shape == (2,)
    sys = b.apply({"friction[*foot*, floor]": jnp.array([2.0, 0.5])})
    f0, f1 = np.asarray(HOPPER.sys.geom_friction[:, 0]), np.asarray(sys.geom_friction[:, 0])
    idx = C.names.select(HOPPER.sys, "geoms", "*foot*, floor", "x")
    np.testing.assert_allclose(f1[idx], f0[idx] * np.array([2.0, 0.5]))
    np.testing.assert_array_equal(np.delete(f1, idx), np.delete(f0, idx))


def test_context_names_say_which_elements_varied_and_reach_the_physics():
    space = C.ContextSpace({"mass[torso]": C.Scale(0.5, 2.0)})
    env = make_contextual("hopper", space, backend="generalized", episode_length=100)

    @jax.jit
    def height(ranges):
        s = env.reset(jax.random.key(0), ranges)
        s = jax.lax.fori_loop(0, 30, lambda i, s: env.step(s, jnp.zeros(3)), s)
        return s.pipeline_state.q[1], s.info[CONTEXT]

    light, ctx = height(space.pinned({"mass[torso]": 0.5}))
    heavy, _ = height(space.pinned({"mass[torso]": 2.0}))
    assert set(ctx) == {"mass[torso]"}
    assert abs(float(light) - float(heavy)) > 1e-3


@pytest.mark.parametrize(
    "name, message",
    [
        ("mass[pelvis]", "no body named 'pelvis'; valid bodies: torso, thigh, leg, foot"),
        ("mass[9]", "index 9 is out of range for 4 bodies"),
        ("mass[]", "empty element selection"),
        ("gravity[torso]", "a single value, it has no elements"),
        ("friction[floo]", "valid geoms: floor"),
        ("mass[torso, t*]", "body torso is chosen twice .by 'torso' and 't.'."),
        ("mass[1, thigh]", "body thigh is chosen twice"),
    ],
)
def test_bad_selections_name_the_valid_elements(name, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        C.bind(C.ContextSpace({name: C.Scale(0.5, 2.0)}), HOPPER.sys, "generalized")


def test_unnamed_elements_are_listed_with_their_index():
    with pytest.raises(ValueError, match="<unnamed: index 2>"):
        C.bind(C.ContextSpace({"mass[leg]": C.Scale(0.5, 2.0)}), ANT.sys, "generalized")
    C.bind(C.ContextSpace({"mass[2]": C.Scale(0.5, 2.0)}), ANT.sys, "generalized")


def test_one_quantity_twice_over_the_same_elements_is_refused():
    space = C.ContextSpace({"mass": C.Scale(0.5, 2.0), "mass[torso]": C.Scale(0.5, 2.0)})
    with pytest.raises(ValueError, match="both write the same elements"):
        C.bind(space, HOPPER.sys, "generalized")
    disjoint = C.ContextSpace({"mass[torso]": C.Scale(0.5, 2.0), "mass[foot]": C.Scale(0.5, 2.0)})
    b = C.bind(disjoint, HOPPER.sys, "generalized")
    sys = b.apply({"mass[torso]": jnp.float32(2.0), "mass[foot]": jnp.float32(0.5)})
    m0, m1 = np.asarray(HOPPER.sys.link.inertia.mass), np.asarray(sys.link.inertia.mass)
    np.testing.assert_allclose(m1, m0 * np.array([2.0, 1.0, 1.0, 0.5]), rtol=1e-6)
