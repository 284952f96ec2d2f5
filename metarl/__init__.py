"""metarl: meta-RL and curriculum learning on Brax / MuJoCo-MJX physics contexts.

Packages: `metarl.contexts`, `metarl.envs`, `metarl.agents.ppo`, `metarl.evaluation`,
`metarl.tensorboard`, `metarl.checkpoint`, `metarl.experiment` (with `metarl.provenance`,
the software a run records); curricula live in the top-level `curricula` package.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("metarl")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0+unknown"
