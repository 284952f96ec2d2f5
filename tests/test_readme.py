"""The README's Python examples run as printed, and say what they return.

Each ```python block of README.md runs, in order, in one namespace (a later example
uses an earlier one's imports), unless its first line says it is a sketch (its
variables are the reader's). A line `EXPR  # words: {"name": [dims], ...}` is a claim about
EXPR's arrays: each name listed is checked for those dimensions. The MJCF example
loads the reader's `robot.xml`: here a small robot of our own with a hip servo.
"""

import ast
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SKETCH = "# a sketch"
CLAIM = re.compile(r"^(?P<expr>[^#]+?)\s+#[^{]*(?P<claim>\{.*\})\s*$")

ROBOT = """<mujoco>
  <worldbody>
    <geom type="plane" size="5 5 0.1"/>
    <body name="torso" pos="0 0 1">
      <freejoint/>
      <geom type="capsule" size="0.05 0.2"/>
      <body name="leg">
        <joint name="left_hip" type="hinge" axis="0 1 0"/>
        <geom type="capsule" fromto="0 0 0 0 0 -0.4" size="0.04"/>
      </body>
    </body>
  </worldbody>
  <actuator><position name="left_hip" joint="left_hip" kp="10" ctrlrange="-1 1"/></actuator>
</mujoco>
"""


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def _claims(block: str) -> list[tuple[str, dict[str, list[int]]]]:
    """(EXPR, {name: dims}) for each `EXPR  # words: {"name": [dims], ...}` line; a claim's
    trailing `...` (names left out) is dropped."""
    out = []
    for line in block.splitlines():
        m = CLAIM.match(line)
        if m:
            claim = re.sub(r",\s*\.\.\.\s*\}$", "}", m["claim"])
            out.append((m["expr"].strip(), ast.literal_eval(claim)))
    return out


def test_the_readmes_examples_run_and_return_what_they_say(tmp_path, monkeypatch):
    runnable = [b for b in _blocks() if not b.startswith(SKETCH)]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "robot.xml").write_text(ROBOT)
    namespace: dict = {}
    checked = 0
    for block in runnable:
        exec(compile(block, "README.md", "exec"), namespace)
        for expr, claim in _claims(block):
            arrays = eval(expr, namespace)
            for name, dims in claim.items():
                assert np.shape(arrays[name]) == tuple(dims), (expr, name)
                checked += 1
    assert checked == 4  # the Contexts example's three draws and a derived constant

    # each of the 256 envs drew its own gravity, in the example's range
    state, space = namespace["state"], namespace["space"]
    gravity = np.asarray(state.info["context"]["gravity"])
    assert np.unique(gravity).size == gravity.size
    assert 7.0 <= gravity.min() and gravity.max() <= 12.0
    assert list(namespace["goal"]) == ["goal_distance", "mass[body1]"]
    assert set(space) == {"gravity", "mass", "friction", "geom_solref[:, 0]"}

    # the user's own MJCF runs with the README's observe, reward and terminated
    walker = namespace["walker"]
    s = jax.jit(walker.reset)(jax.random.key(0))
    s = jax.jit(walker.step)(s, jnp.ones(walker.action_size))
    assert s.obs.shape == (walker.observation_size,) and np.isfinite(s.reward)
    assert 0.5 <= float(s.info["context"]["actuator_kp[*hip*]"]) <= 1.5
