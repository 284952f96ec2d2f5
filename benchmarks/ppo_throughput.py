"""PPO throughput and return: metarl (mlp, gru) against Brax's own PPO.

Same env, same data per update: `num_envs` envs unroll `unroll_length` steps,
the batch is split into `num_minibatches` minibatches, `num_updates_per_batch`
epochs (Brax: batch_size = num_envs / num_minibatches, so one unroll of every
env feeds one update round), same network sizes, learning rate, entropy cost,
discount, GAE lambda, clipping. Both normalise observations by running
statistics, but not alike: metarl clips the normalised observation to
+-`metarl.agents.agent.OBS_CLIP` (10) standard deviations and Brax PPO does not
clip; metarl updates the statistics after the SGD epochs (the critic and SGD use
the statistics the rollout acted with, `metarl.agents.ppo.learner`), Brax PPO
before them (its default, without the adaptive-KL learning rate). The env has no
varying context (an empty ContextSpace for metarl), so the trainers are
compared, not the randomisation. The algorithms differ in three more places, which
the speed and the return both include: Brax recomputes GAE inside every
minibatch's loss with the current critic (`num_minibatches x num_updates_per_batch`
GAE scans and bootstrap passes an iteration), metarl once an iteration before the
epochs (`metarl.agents.ppo.learner`); Brax, with its default
`bootstrap_on_timeout=False`, gives a truncated step no advantage, metarl
bootstraps it from V(final_obs); Brax's auto-reset restarts every env from the
state it first reset to, metarl from a fresh reset.

Reported per trainer, in one run: steady training env-steps/s, compile time
(the wall time of training minus the steps trained / steady speed: tracing,
compiling and the first segment's overhead; the env is built beforehand and
evaluation is left out on both sides), and the deterministic evaluation return
of the final policy at the same step budget (Brax: its own evaluator; metarl:
`metarl.evaluation`, both over full-length episodes). metarl builds its
evaluator before the clock and evaluates after it; Brax PPO does both inside
`train`, so three things are subtracted from its wall time: its evaluations (their own
``eval/walltime``), the build of its evaluator (`acting.Evaluator.__init__`,
which compiles and runs the eval env's reset) and its final check that the
training state is still replicated (`pmap.assert_is_replicated`, a small pmap
compiled and run; metarl has none). The last two are timed by wrapping them
for the call (`_timed`), on `brax_train.acting.Evaluator` and
`brax_train.pmap`: the objects Brax's train.py looks those names up on when it
calls them. Brax's per-seed results record them as ``evaluator_build_s`` and
``replication_check_s`` (earlier result files counted both as compile time).

With several `--seeds`, the trainers run in paired rounds: seed 0 of every
trainer, then seed 1 of every trainer, ... (metarl compiles once and reuses the
program; Brax compiles per call, and with `--compile-cache` loads the programs
of its later seeds from JAX's persistent cache). Speeds are medians over
seeds, compile times the first seed's; a metarl trainer's speed against Brax PPO's is
also given per seed, paired in its round, as the geometric mean of those ratios with
its 95% t interval (on their logs; with 2 seeds or more); returns are summarised as
the IQM with a 95% bootstrap CI, and each metarl trainer's mean return is compared
with Brax PPO's: the difference of means with Welch's 95% t interval
(`metarl.stats.difference`). A return claim needs that interval, not one seed, and
an interval holding 0 shows no difference, not equal returns: the "equal" column
says whether the returns are equal within `--equal-margin` (5%) of Brax PPO's mean,
by two one-sided t tests (`metarl.stats.equivalent`).

Brax 0.14.2's PPO calls `jax.device_put_replicated`, which JAX 0.10 removed
from its public API; this benchmark re-exposes it (one line, benchmark only).

    python benchmarks/ppo_throughput.py --num-timesteps 1_000_000
    python benchmarks/ppo_throughput.py --env hopper --num-timesteps 300_000 \
        --num-envs 256 --no-gru --seeds 0 1 2 3 4 5 6 7 --out benchmarks/results/ppo_cpu2.json

Seeds can run in several calls (one process per core, or one call after
another) and be summarised together: `--merge A.json B.json` adds the per-seed
results of earlier `--out` files, refusing any file run with other settings,
another JAX or device, another platform (`metarl.provenance.platform()`: device
count, XLA_FLAGS, JAX's numerical settings, the host CPU; a file from before
it was recorded merges with a note), or a seed already present; `--seeds` with no value
trains nothing and summarises the files, compared with the first of them instead of
this machine (GPU results summarise on a laptop). A file run on other software (metarl's
source hash or a library version, `metarl.provenance`) is refused too, unless
`--other-software` is given, which merges it and prints what differs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
import tyro
from _cli import check_counts, paired_ratio, write_json

from metarl import contexts as C
from metarl import evaluation as E
from metarl import provenance, stats
from metarl.agents import ppo
from metarl.envs import make_contextual

if not hasattr(jax, "device_put_replicated"):  # Brax 0.14.2 on JAX 0.10
    from jax._src.api import device_put_replicated

    jax.device_put_replicated = device_put_replicated


@dataclasses.dataclass(frozen=True)
class Config:
    env: str = "inverted_pendulum"
    num_timesteps: int = 1_000_000
    num_envs: int = 512
    unroll_length: int = 16
    num_minibatches: int = 8
    num_updates_per_batch: int = 4
    learning_rate: float = 1e-3
    entropy_cost: float = 1e-3
    discounting: float = 0.97
    episode_length: int = 1000
    segments: int = 5
    eval_episodes: int = 16
    seeds: tuple[int, ...] = (0,)
    gru: bool = True  # also time metarl's GRU agent
    # also time metarl's mlp agent with this reset strategy (e.g. "dense"; the others
    # use "auto"), as trainer metarl_mlp_<strategy>
    strategy: str | None = None
    # Brax PPO compiles its programs again for every seed (about 100 s each on the
    # H100): with --compile-cache, seeds after the first load them from JAX's
    # persistent compilation cache, in a temporary directory of this run only (so
    # the compile time reported, the first seed's, is still a compile)
    compile_cache: bool = False
    out: str | None = None  # a JSON file for the per-seed results
    # --out files of earlier runs with these settings and other seeds: their per-seed
    # results join this run's in the summary (--seeds with no value: summary only)
    merge: tuple[str, ...] = ()
    # merge --merge files run on other software (metarl's source, library versions)
    # too, printing the differences; without it such a file is refused
    other_software: bool = False
    # "equal return": a metarl trainer's mean return within this fraction of Brax PPO's,
    # shown by two one-sided t tests (`metarl.stats.equivalent`: the 90% Welch interval
    # inside the margin). An interval that merely holds 0 shows no difference, not
    # equality (the H200's 2 seeds: +71 [-1438, 1579])
    equal_margin: float = 0.05

    def __post_init__(self):
        check_counts(self, ids=("seeds",))
        if not (math.isfinite(self.equal_margin) and 0 < self.equal_margin < 1):
            raise ValueError(
                f"--equal-margin must be a fraction of Brax PPO's return in (0, 1), got "
                f"{self.equal_margin}"
            )
        if repeated := sorted({s for s in self.seeds if self.seeds.count(s) > 1}):
            raise ValueError(
                f"--seeds names seed {', '.join(map(str, repeated))} more than once: each seed "
                "trains once (a repeat would replace the first result, its compile time too)"
            )
        if not self.seeds and not self.merge:
            raise ValueError(
                "--seeds with no value trains nothing and summarises --merge files: give "
                "seeds to train, or --merge FILE.json ..."
            )


POLICY, VALUE = (32, 32), (64, 64)


@contextlib.contextmanager
def _timed(owner, name: str, seconds: dict[str, float], label: str, wait_self: bool = False):
    """Within the block, `owner.<name>` adds the wall time of each call to
    `seconds[label]`, after waiting for what it computed (its result, or with
    `wait_self` the arrays of its first argument: an `__init__`'s object). The
    original is put back on exit. A label missing from `seconds` afterwards was
    never called."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        out = original(*args, **kwargs)
        jax.block_until_ready(vars(args[0]) if wait_self else out)
        seconds[label] = seconds.get(label, 0.0) + time.perf_counter() - start
        return out

    setattr(owner, name, timed)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _shared(cfg: Config) -> dict:
    """The settings both trainers take under the same names."""
    names = ("num_envs", "unroll_length", "num_minibatches", "num_updates_per_batch")
    return {k: getattr(cfg, k) for k in names + ("learning_rate", "entropy_cost", "discounting")}


def brax_kwargs(cfg: Config, seed: int) -> dict:
    """Brax PPO's `train` arguments for these settings, but the env and progress_fn."""
    from brax.training.agents.ppo import networks as ppo_networks

    return dict(
        **_shared(cfg),
        num_timesteps=cfg.num_timesteps,
        episode_length=cfg.episode_length,
        batch_size=cfg.num_envs // cfg.num_minibatches,
        gae_lambda=0.95,
        clipping_epsilon=0.3,
        max_grad_norm=1.0,
        normalize_observations=True,
        num_evals=cfg.segments + 1,
        num_eval_envs=cfg.eval_episodes,
        deterministic_eval=True,
        seed=seed,
        network_factory=functools.partial(
            ppo_networks.make_ppo_networks,
            policy_hidden_layer_sizes=POLICY,
            value_hidden_layer_sizes=VALUE,
        ),
    )


def metarl_config(cfg: Config, core: str) -> ppo.PPOConfig:
    """metarl's PPO config for these settings (seed 0)."""
    return ppo.PPOConfig(
        **_shared(cfg),
        core=core,
        hidden_size=32 if core != "mlp" else ppo.PPOConfig.hidden_size,  # mlp: none
        policy_hidden=POLICY,
        value_hidden=VALUE,
        rl2_inputs=core != "mlp",
    )


def brax_ppo(cfg: Config, seed: int) -> dict:
    from brax import envs as brax_envs
    from brax.training.agents.ppo import train as brax_train

    rewards, sps, steps, eval_s = [], [], [0], [0.0]

    def progress(step, metrics):
        steps.append(int(step))
        if "eval/episode_reward" in metrics:
            rewards.append(float(metrics["eval/episode_reward"]))
        if "eval/walltime" in metrics:  # Brax's evaluation time so far, its compile included
            eval_s.append(float(metrics["eval/walltime"]))
        if "training/sps" in metrics:
            sps.append(float(metrics["training/sps"]))

    environment = brax_envs.get_environment(cfg.env)  # built before the clock, as metarl's
    outside = {}  # Brax's work outside training and outside eval/walltime (module docstring)
    with contextlib.ExitStack() as patches:  # on the names train.py looks up when it calls
        patches.enter_context(
            _timed(brax_train.acting.Evaluator, "__init__", outside, "evaluator_build_s", True)
        )
        patches.enter_context(
            _timed(brax_train.pmap, "assert_is_replicated", outside, "replication_check_s")
        )
        start = time.perf_counter()
        brax_train.train(environment=environment, progress_fn=progress, **brax_kwargs(cfg, seed))
        wall = time.perf_counter() - start
    missing = {"evaluator_build_s", "replication_check_s"} - outside.keys()
    if missing:  # another Brax, whose train.py reaches them by other names: nothing was timed
        raise RuntimeError(
            f"Brax PPO never called the wrapped functions {sorted(missing)}: its train.py no "
            "longer calls acting.Evaluator / pmap.assert_is_replicated; update brax_ppo"
        )
    total = wall - max(eval_s) - sum(outside.values())
    steady = float(np.median(sps[2:]))  # Brax compiles its epoch twice
    return {
        "steps_per_sec": steady,
        "compile_s": total - max(steps) / steady,
        "return": rewards[-1],
        **outside,
    }


def metarl_ppo(cfg: Config, core: str, reset_strategy: str = "auto"):
    """A function seed -> result; the program compiles in its first call only."""
    env = make_contextual(
        cfg.env,
        C.ContextSpace({}),
        episode_length=cfg.episode_length,
        reset_strategy=reset_strategy,
    )
    config = metarl_config(cfg, core)
    evaluator = E.Evaluator(env, episodes=cfg.eval_episodes, max_contexts=1)

    @functools.cache
    def train_space():  # on first use, compiled as ppo.train compiles a space it builds
        space = ppo.make_train_space(env, config)
        ppo.precompile(space, skip_cpu=True)
        return space

    def run(seed: int) -> dict:
        start = time.perf_counter()
        space = train_space()
        _, ts, history = ppo.train(
            env,
            dataclasses.replace(config, seed=seed),
            cfg.num_timesteps,
            segments=cfg.segments,
            space=space,
        )
        total = time.perf_counter() - start
        steady = float(np.median([m["env_steps_per_sec"] for m in history[1:]]))
        result = evaluator.evaluate(
            ppo.make_policy(space, ts), E.ContextSet("train", {}), jax.random.key(seed)
        )
        return {
            "steps_per_sec": steady,
            "compile_s": total - history[-1]["env_steps"] / steady,
            "return": float(result.mean[0]),
        }

    return run


def _environment() -> dict:
    """The JAX version and device (and on the CPU backend the host CPU) that a --merge
    file must share: another CPU or core count gives other speeds and returns."""
    environment = {"jax": jax.__version__, "device": jax.devices()[0].device_kind}
    if jax.default_backend() == "cpu":
        environment.update(provenance.host_cpu())
    return environment


def _record(
    cfg: Config,
    environment: dict,
    runs: dict,
    summary: dict,
    merged: list,
    reference: dict | None = None,
) -> dict:
    """What --out writes, and --merge reads back. `platform` and `software` are this
    process's, for the seeds it trained (a summary's: its first file's, `reference`);
    `merged` holds the provenance of the seeds it took from --merge files (each checked
    again when this file is merged)."""
    reference = reference or _here()
    return {
        "config": dataclasses.asdict(cfg),
        **environment,
        "platform": reference["platform"],  # XLA_FLAGS, ...: compared on --merge
        "software": reference["software"],
        "runs": runs,
        "merged": merged,
        "summary": summary,
    }


def _differences(theirs: dict, mine: dict) -> str:
    """The fields where two records differ, as "name=theirs (here mine)"."""
    return ", ".join(
        f"{k}={theirs.get(k)!r} (here {mine.get(k)!r})"
        for k in sorted(theirs.keys() | mine.keys())
        if theirs.get(k) != mine.get(k)
    )


def _here() -> dict:
    """This process's platform and software, which --merge files are compared with."""
    return {"platform": provenance.platform(), "software": provenance.software()}


def _summarised(path: str) -> tuple[dict, dict]:
    """`--seeds` with no value summarises --merge files, wherever it runs (GPU results
    on a laptop): the first file's JAX, device and host CPU (`_environment`), platform
    and software are what the files are compared with, instead of this process's."""
    first = json.loads(Path(path).read_text())
    keys = ("jax", "device", *provenance.host_cpu())
    environment = {k: first[k] for k in keys if k in first}
    return environment, {k: first.get(k) for k in ("platform", "software")}


def _merge(
    runs: dict, path: str, cfg: Config, environment: dict, reference: dict | None = None
) -> list[dict]:
    """Adds the per-seed results of an earlier run's --out file to `runs`, after
    checking that it ran these settings (seeds aside) on this JAX and device (and host CPU)
    and platform (`provenance.platform()`, where the file records it), and that no seed is
    in both. `environment` and `reference` (platform and software) are this process's
    unless given (`_summarised`). Returns the provenance of the seeds it added: the
    file's own (path, platform, software, seeds per trainer) and those it had merged
    itself."""
    record = json.loads(Path(path).read_text())
    if not isinstance(record, dict) or not {"config", "runs"} <= record.keys():
        raise ValueError(
            f"--merge {path}: not a file this script wrote with --out (it has no 'config' "
            "and 'runs')"
        )
    # settings of the summary, not of the runs
    ignore = ("seeds", "out", "merge", "compile_cache", "other_software", "equal_margin")
    mine = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ignore}
    mine.update(environment)
    theirs = {k: v for k, v in record["config"].items() if k not in ignore}
    theirs.update({k: record.get(k) for k in environment})
    if differ := _differences(theirs, mine):
        raise ValueError(f"--merge {path} ran other settings: {differ}")
    # the file's own seeds, and those it had merged itself, each under its own record
    sources = [{"path": path, **{k: record.get(k) for k in ("platform", "software")}}]
    for source in sources + record.get("merged", []):
        _check_provenance(source, cfg, reference)
    if any("evaluator_build_s" not in r for r in record["runs"].get("brax_ppo", {}).values()):
        print(
            f"--merge {path}: its Brax PPO compile_s still counts the evaluator's build and "
            "the replication check (written before they were left out)"
        )
    for name, per_seed in record["runs"].items():
        both = sorted(runs[name].keys() & per_seed.keys(), key=int)
        if both:
            raise ValueError(f"--merge {path}: seeds {both} of {name} are already in the summary")
        runs[name].update(per_seed)
    trained = {str(s) for s in record["config"]["seeds"]}  # the file's own, not its merges
    own = {
        name: sorted(trained & per_seed.keys(), key=int)
        for name, per_seed in record["runs"].items()
    }
    return [{**sources[0], "seeds": own}, *record.get("merged", [])]


def _check_provenance(source: dict, cfg: Config, reference: dict | None = None) -> None:
    """Refuses seeds run on another platform, or other software without --other-software,
    than this process's (or `reference`'s)."""
    path = source["path"]
    reference = reference or _here()
    theirs, mine = source.get("platform"), reference["platform"]
    if not isinstance(theirs, dict):  # older files: the backend's name, or nothing
        print(
            f"--merge {path}: the file records no platform (older benchmark): its XLA_FLAGS, "
            "device count and JAX settings are not compared"
        )
    elif provenance.comparable(theirs) != provenance.comparable(mine):  # flags in any order
        raise ValueError(f"--merge {path} ran on another platform: {_differences(theirs, mine)}")
    theirs, mine = source.get("software"), reference["software"]
    if theirs is None:
        print(f"--merge {path}: the file records no software (older benchmark); not compared")
    elif theirs != mine:
        text = _differences(theirs, mine)
        if not cfg.other_software:
            raise ValueError(
                f"--merge {path} ran on other software: {text}; "
                "pass --other-software to merge it anyway"
            )
        print(f"--merge {path}: other software, merged as asked: {text}")


def main(cfg: Config) -> None:
    if cfg.segments < 3:
        raise ValueError(
            f"--segments must be at least 3, got {cfg.segments}: Brax PPO compiles in its "
            "first two training epochs, and the speed is the median of the others"
        )
    if cfg.compile_cache:
        cache = tempfile.TemporaryDirectory(prefix="ppo_throughput_cache_")
        jax.config.update("jax_compilation_cache_dir", cache.name)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {cfg}")
    trainers = {
        "brax_ppo": functools.partial(brax_ppo, cfg),
        "metarl_mlp": metarl_ppo(cfg, "mlp"),
    }
    if cfg.gru:
        trainers["metarl_gru"] = metarl_ppo(cfg, "gru")
    if cfg.strategy is not None:
        trainers[f"metarl_mlp_{cfg.strategy}"] = metarl_ppo(cfg, "mlp", cfg.strategy)
    environment, reference = _environment(), None
    if not cfg.seeds and cfg.merge:
        environment, reference = _summarised(cfg.merge[0])
        print(f"summarising --merge files as run on {environment}")
    runs = {name: {} for name in trainers}
    merged = []
    for path in cfg.merge:  # checked before any training: a file that cannot merge costs nothing
        merged += _merge(runs, path, cfg, environment, reference)
    for name in trainers:
        both = sorted({str(s) for s in cfg.seeds} & runs[name].keys(), key=int)
        if both:
            raise ValueError(f"--seeds {both} of {name} are already in the --merge files")
    names = list(trainers)
    for i, seed in enumerate(cfg.seeds):  # paired rounds: every trainer once per seed,
        # each round starting with another (Brax PPO always ran first before 2026-12-05)
        for name in names[i % len(names) :] + names[: i % len(names)]:
            runs[name][str(seed)] = r = trainers[name](seed)
            print(f"{name} seed {seed}: {r}", flush=True)
    first = str(cfg.seeds[0]) if cfg.seeds else None

    def compile_s(name: str) -> float:
        """This run's first seed's compile time (the merged files' first without --seeds)."""
        return runs[name].get(first, next(iter(runs[name].values())))["compile_s"]

    med = lambda name, key: float(np.median([r[key] for r in runs[name].values()]))  # noqa: E731
    returns = {name: [r["return"] for r in rs.values()] for name, rs in runs.items()}
    base = med("brax_ppo", "steps_per_sec")
    print(
        f"\n{len(runs['brax_ppo'])} seed(s); steps/s: median; compile: first seed; return: "
        "IQM [95% CI]; vs Brax return: difference of means [Welch 95% CI]; equal: within "
        f"{cfg.equal_margin:.0%} of Brax PPO's mean return (two one-sided tests, 90% interval)"
    )
    brax_mean = float(np.mean([r for r in returns["brax_ppo"] if np.isfinite(r)] or [np.nan]))
    margin = cfg.equal_margin * abs(brax_mean)
    w = max(map(len, runs)) + 1
    print(
        f"{'trainer':<{w}}{'steps/s':>10}{'vs brax':>9}{'compile s':>11}"
        f"  {'eval return':>26}  {'vs brax return':>30}{'equal':>11}"
    )
    summary, speeds = {}, []
    for name in runs:
        sps = med(name, "steps_per_sec")
        ret = stats.summarize(returns[name])
        summary[name] = {
            "steps_per_sec": sps,
            "vs_brax": sps / base,
            "compile_s": compile_s(name),
            "return_iqm": dataclasses.asdict(ret),
        }
        vs = verdict = ""
        if name != "brax_ppo":
            summary[name]["speed_vs_brax_paired"] = paired = _paired_speed(runs, name)
            speeds.append(f"{name}: {_format_speed(paired)}")
            diff = stats.difference(returns[name], returns["brax_ppo"])
            summary[name]["return_minus_brax"] = dataclasses.asdict(diff)
            vs = stats.format_difference(diff)
            equal, interval = (
                (None, None)
                if not margin > 0
                else stats.equivalent(returns[name], returns["brax_ppo"], margin)
            )
            summary[name]["return_equal_to_brax"] = {
                "margin": margin,
                "equal": equal,
                "ci90": None if interval is None else [interval.ci_low, interval.ci_high],
            }
            verdict = {True: "yes", False: "not shown", None: "no CI"}[equal]
        print(
            f"{name:<{w}}{sps:>10,.0f}{sps / base:>9.2f}{compile_s(name):>11.1f}"
            f"  {stats.format_iqm(ret, 1):>26}  {vs:>30}{verdict:>11}"
        )
    print("steps/s against Brax PPO's in the same round, geometric mean [95% CI] over seeds:")
    print("\n".join(f"  {line}" for line in speeds))
    if cfg.gru:
        ratio = med("metarl_gru", "steps_per_sec") / med("metarl_mlp", "steps_per_sec")
        print(f"gru / mlp throughput: {ratio:.2f}")
    if cfg.out:
        record = _record(cfg, environment, runs, summary, merged, reference)
        write_json(cfg.out, record)


def _paired_speed(runs: dict, name: str) -> dict:
    """`name`'s steps/s against Brax PPO's, seed by seed (the two ran in one round):
    the geometric mean of the ratios and its 95% t interval (`_cli.paired_ratio`
    on their logs, paired; NaN bounds below 2 seeds), over the seeds both ran."""
    seeds = sorted(runs[name].keys() & runs["brax_ppo"].keys(), key=int)
    sps = lambda trainer: [runs[trainer][s]["steps_per_sec"] for s in seeds]  # noqa: E731
    ratio, low, high = paired_ratio(sps(name), sps("brax_ppo"))
    return {"seeds": len(seeds), "ratio": ratio, "ci_low": low, "ci_high": high}


def _format_speed(paired: dict) -> str:
    """``"1.03x [0.95, 1.11] over 8 seeds"``."""
    low, high = paired["ci_low"], paired["ci_high"]
    ci = "no CI" if np.isnan(low) else f"{low:.2f}, {high:.2f}"
    return f"{paired['ratio']:.2f}x [{ci}] over {paired['seeds']} seeds"


if __name__ == "__main__":
    main(tyro.cli(Config))
