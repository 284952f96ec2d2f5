"""Curricula over context ranges: pure functions over an explicit, checkpointable state.

```python
import curricula
cur = curricula.LinearWidening(start=0.1, segments=20)
state = cur.init(env.space, defaults=env.default_context(), num_envs=256, key=key)
for _ in range(num_segments):
    ts, es, metrics = ppo.run_train(space, ts, es, steps, context=cur.ranges(state))
    state = cur.update(state, metrics)
```

Each curriculum is a factory returning a `Curriculum` of `init`, `update` and
`ranges`; `ranges` keeps the target's names, kinds and parameter shapes (per env
for ADR), so the trainer never recompiles.

`update(state, results)` takes a mapping; the keys the trainer and experiment
scripts provide are "episode_return" (float, mean return of the training
episodes completed in the segment), "eval_return" (float, mean evaluation
return on the current ranges), "env_return_sum" and "env_episodes" (arrays
[num_envs]: per-env sum of returns and number of episodes completed in the
segment whose trial drew its context from the segment's ranges, not from the ranges
before it). A missing key raises a KeyError naming it. Keys each curriculum reads:

* `LinearWidening`, `GeometricWidening`: none;
* `PerformanceGated`: its `metric`: "eval_return", or for "episode_return" the
  training return on the segment's own ranges, "env_return_sum" and "env_episodes";
* `ADR`: "env_return_sum" and "env_episodes".

`summary(state, results)` (optional in a `Curriculum`) reads the same results
and returns what `update` would decide on, as numbers to log: the fraction trained
on, the gate's return and threshold, ADR's per-boundary returns and moves.
"""

from curricula.adr import ADR, ADRState, adr_ranges
from curricula.base import Curriculum, CurriculumState, check_compatible
from curricula.gated import GatedState, PerformanceGated
from curricula.widening import GeometricWidening, LinearWidening, WideningState

__all__ = [
    "ADR",
    "ADRState",
    "Curriculum",
    "CurriculumState",
    "GatedState",
    "GeometricWidening",
    "LinearWidening",
    "PerformanceGated",
    "WideningState",
    "adr_ranges",
    "check_compatible",
]
