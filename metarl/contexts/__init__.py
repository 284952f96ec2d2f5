"""Context distributions over physics parameters.

```python
from metarl import contexts as C
space = C.ContextSpace({
    "gravity": C.Uniform(7.0, 12.0),                  # absolute, m/s^2
    "mass": C.Scale(0.7, 1.3, per_element=True),      # x default, one draw per body
    "friction": C.Uniform(0.4, 1.2),                  # absolute, shared by colliding geoms
    "geom_solref[:, 0]": C.Uniform(0.01, 0.03),       # raw System path, for experts
})
```
"""

from metarl.contexts import names
from metarl.contexts.distributions import (
    Choice,
    Distribution,
    Fixed,
    LogUniform,
    Normal,
    Scale,
    TruncatedNormal,
    Uniform,
)
from metarl.contexts.quantities import BACKENDS
from metarl.contexts.space import (
    CANONICAL_NAMES,
    Binding,
    Context,
    ContextSpace,
    EnvDefaults,
    PerEnv,
    bind,
)

__all__ = [
    "BACKENDS",
    "CANONICAL_NAMES",
    "Binding",
    "Choice",
    "Context",
    "ContextSpace",
    "Distribution",
    "EnvDefaults",
    "Fixed",
    "LogUniform",
    "Normal",
    "PerEnv",
    "Scale",
    "TruncatedNormal",
    "Uniform",
    "bind",
    "names",
]
