"""Interim: replaced by the stats branch."""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import stats as _st


@dataclasses.dataclass(frozen=True)
class Summary:
    mean: float
    iqm: float
    ci_low: float
    ci_high: float
    n: int


def summarize(scores, *, reps=2000, confidence=0.95, seed=0) -> Summary:
    x = np.asarray(scores, float).reshape(len(scores), -1)
    x = x[np.isfinite(x).all(1)]
    if len(x) == 0:
        return Summary(*(float("nan"),) * 4, 0)
    iqm = float(_st.trim_mean(x.ravel(), 0.25))
    rng = np.random.default_rng(seed)
    boots = [
        float(_st.trim_mean(x[rng.integers(0, len(x), len(x))].ravel(), 0.25)) for _ in range(reps)
    ]
    a = (1 - confidence) / 2
    return Summary(
        float(x.mean()), iqm, float(np.quantile(boots, a)), float(np.quantile(boots, 1 - a)), len(x)
    )


def format_iqm(s: Summary) -> str:
    return f"{s.iqm:.0f} [{s.ci_low:.0f}, {s.ci_high:.0f}]"
