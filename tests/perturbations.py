"""One perturbation per canonical quantity, shared by the physics tests of every env
source: a value away from the default that must change the trajectory."""

# name -> (relative?, per_element?, perturbation of the default values)
PERTURB = {
    "gravity": (False, False, lambda d: d * 1.5),
    "mass": (False, True, lambda d: d * 2.0),
    "inertia": (True, True, lambda d: d * 3.0),
    "friction": (False, True, lambda d: d * 0.2),
    "damping": (False, True, lambda d: d + 1.0),
    "armature": (False, True, lambda d: d + 0.5),
    "stiffness": (False, True, lambda d: d + 20.0),
    "actuator_gain": (False, True, lambda d: d * 0.5),
    "geom_size": (True, True, lambda d: d * 1.5),
    "viscosity": (False, False, lambda d: d + 5.0),
    "density": (False, False, lambda d: d + 1000.0),
    "timestep": (False, False, lambda d: d * 1.3),
    "elasticity": (False, True, lambda d: d + 0.5),
    "com_offset": (False, True, lambda d: d + 0.05),
    # MJX-only quantities that need a model feature the puck lacks (frictionloss > 0,
    # position servos, contact pairs): tests/test_model_envs.py perturbs them on an MJCF.
    "frictionloss": (False, True, lambda d: d * 3.0),
    "actuator_kp": (False, True, lambda d: d * 2.0),
    "actuator_kd": (False, True, lambda d: d + 1.0),
    "pair_friction": (False, True, lambda d: d * 0.2),
}
