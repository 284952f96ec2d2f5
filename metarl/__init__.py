"""metarl: meta-RL and curriculum learning on Brax / MuJoCo-MJX physics contexts.

Packages: `metarl.contexts`, `metarl.envs`, `metarl.agents.ppo`, `metarl.evaluation`,
`metarl.tensorboard`, `metarl.checkpoint`, `metarl.experiment`; curricula live in the
top-level `curricula` package.
"""
