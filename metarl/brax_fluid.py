"""Brax's fluid model under JAX 0.10 and later.

Brax 0.14.2's `brax/fluid.py`, the drag its generalized, positional and spring
backends add to every step of a System whose static `enable_fluid` is set (swimmer's
MJCF loads a viscosity and a density, and metarl's 'viscosity' and 'density' contexts set it),
calls `jnp.clip(x, a_min=1e-12)`. JAX no longer takes numpy's `a_min` / `a_max`
spellings (JAX 0.10 takes `min` / `max` only), so every such step raised
"TypeError: clip() got an unexpected keyword argument 'a_min'" when traced: Brax's
own swimmer could not take a step.

`install()` gives that one module a `jax.numpy` whose `clip` also takes the old
spellings; every other name it looks up is jax.numpy's own, and nothing else in
Brax changes. It does nothing where the installed JAX still takes `a_min`, or where
Brax's module no longer reaches jax.numpy by the name `jp`. Brax says its own
pipelines are no longer maintained, so no fix upstream is to be expected.
"""

from __future__ import annotations

import inspect
import types

import jax.numpy as jnp


def _clip(arr=None, /, min=None, max=None, *, a_min=None, a_max=None):
    """jax.numpy's clip, taking numpy's old keywords `a_min` and `a_max` too."""
    return jnp.clip(arr, min=a_min if min is None else min, max=a_max if max is None else max)


class _NumpyWithOldClip(types.ModuleType):
    """jax.numpy, but for `clip` (`_clip`)."""

    clip = staticmethod(_clip)

    def __getattr__(self, name: str):
        return getattr(jnp, name)


_NUMPY = _NumpyWithOldClip("jax.numpy, clip taking a_min and a_max (metarl.brax_fluid)")


def _takes_a_min() -> bool:
    """Read from the signature: a call would start JAX's backends at import, before a
    program could still choose them (`jax.distributed.initialize`, platforms)."""
    try:
        return "a_min" in inspect.signature(jnp.clip).parameters
    except (TypeError, ValueError):  # no signature: the shim forwards min and max anyway
        return False


def install() -> bool:
    """Makes Brax's fluid model run on the installed JAX; True if it changed anything."""
    from brax import fluid

    if getattr(fluid, "jp", None) is not jnp or _takes_a_min():
        return False
    fluid.jp = _NUMPY
    return True
