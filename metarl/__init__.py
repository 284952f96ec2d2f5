"""metarl: meta-RL and curriculum learning on Brax / MuJoCo-MJX physics contexts.

Packages: `metarl.contexts`, `metarl.envs`, `metarl.agents.ppo`, `metarl.evaluation`,
`metarl.tensorboard`, `metarl.checkpoint`, `metarl.experiment`; curricula live in the
top-level `curricula` package.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("metarl")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0+unknown"

import jax as _jax

# JAX's CPU client can deadlock with asynchronous dispatch (jax-ml/jax#25861):
# here `experiments/quickstart.py --num-seeds 10` hung for good in its first
# computations, every thread parked, 2 runs in 2. metarl dispatches few, large
# programs, so synchronous dispatch costs nothing measurable; GPUs are not
# affected. It must be set before JAX creates its CPU client, hence at import.
_jax.config.update("jax_cpu_enable_async_dispatch", False)
