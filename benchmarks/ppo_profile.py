"""Where a PPO iteration's time goes, per core (mlp, gru, lstm): rollout vs learner.

An iteration is: unroll every env for `unroll_length` steps, run the critic
and GAE over the unroll, then `epochs` epochs of minibatch SGD. The SGD cost
is measured by ablation: the same program compiled with 1 and with `epochs`
epochs, timed side by side in paired rounds (each round runs every variant
once, in turn), so

    one SGD epoch = (t[epochs] - t[1]) / (epochs - 1)
    rollout, critic and the rest = t[1] - one SGD epoch

(milliseconds per iteration; each round's differences, then their median over
rounds). Every call starts from the same initial state, so that both programs
roll out the same first iteration (`_call`). On a GPU this says whether
a recurrent core loses its time in the learner's loop over time or in the
rollout. It also counts the operations XLA runs per time step inside the
gradient's loops over time (forward and backward; on a GPU each one is a
kernel launch, so a small recurrent core's loop is bound by their number).
`--trace-dir DIR` also records a `jax.profiler` trace of one
iteration per core (open it with TensorBoard's profile plugin or Perfetto; on
a CPU every XLA thunk is an event, so keep the env small there).

`--strategies pool stock` runs every core once per reset strategy of the env, in the
same paired rounds (rows `core:strategy`, ratios to the first row): what a strategy
costs or saves inside PPO's own loop, the rollout column most of all. `stock@4` is the
stock with `PPOConfig.stock_depth=4` (refilled every 4 steps): what a shallower stock,
the one a device short of memory gets, costs.

    python benchmarks/ppo_profile.py --env inverted_pendulum --num-envs 512
    python benchmarks/ppo_profile.py --env hopper --num-envs 2048 --num-minibatches 16 \\
        --trace-dir /tmp/ppo_trace
    python benchmarks/ppo_profile.py --env hopper --num-envs 2048 --num-minibatches 16 \\
        --cores mlp --strategies pool stock
    python benchmarks/ppo_profile.py --env hopper --num-envs 2048 --num-minibatches 16 \\
        --cores mlp --strategies stock@16 stock@4 stock@1
"""

from __future__ import annotations

import dataclasses
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import tyro
from _cli import check_counts

from metarl import contexts as C
from metarl.agents import ppo
from metarl.agents.ppo import learner
from metarl.envs import make_contextual


@dataclasses.dataclass(frozen=True)
class Config:
    env: str = "inverted_pendulum"
    cores: tuple[str, ...] = ("mlp", "gru")
    num_envs: int = 512
    unroll_length: int = 16
    num_minibatches: int = 8
    epochs: int = 4  # num_updates_per_batch of the full program
    iterations: int = 8  # PPO iterations per timed call
    rounds: int = 5
    trace_dir: str | None = None
    # the env's reset strategies compared ("auto", "pool", "stock", ...; "stock@4": the
    # stock with stock_depth 4): rows core:strategy
    strategies: tuple[str, ...] = ("auto",)

    def __post_init__(self):
        check_counts(self)


def _strategy(spec: str) -> tuple[str, int | None]:
    """ "stock@4" -> ("stock", 4); "pool" -> ("pool", None)."""
    strategy, at, depth = spec.partition("@")
    if at and (strategy != "stock" or not depth.isdigit()):
        raise ValueError(f"--strategies {spec!r}: only the stock takes a depth, as in stock@4")
    return strategy, int(depth) if at else None


def _run(env, cfg: Config, core: str, epochs: int, stock_depth: int | None = None):
    config = ppo.PPOConfig(
        num_envs=cfg.num_envs,
        unroll_length=cfg.unroll_length,
        num_minibatches=cfg.num_minibatches,
        num_updates_per_batch=epochs,
        core=core,
        hidden_size=32 if core != "mlp" else ppo.PPOConfig.hidden_size,  # mlp: none
        policy_hidden=(32, 32),
        value_hidden=(64, 64),
        rl2_inputs=core != "mlp",
        stock_depth=stock_depth,
    )
    space = ppo.make_train_space(env, config)
    k_train, k_env = ppo.split_keys(ppo.seed_keys(0), 2)
    return [space, ppo.init_training_state(space, k_train), ppo.init_env_state(space, k_env)]


_NOT_KERNELS = {"parameter", "get-tuple-element", "tuple", "constant", "bitcast"}


def loop_ops(run) -> list[int]:
    """Operations per iteration of each loop over time in the compiled gradient
    of the PPO loss on one minibatch (forward, then backward), `[]` for an mlp."""
    space, ts, es = run
    config, agent = space.config, space.agent
    batch = jax.eval_shape(lambda: learner.collect(space.env, agent, config, ts, es)[1])
    size = config.num_envs // config.num_minibatches
    pick = lambda x: jax.ShapeDtypeStruct((x.shape[0], size) + x.shape[2:], x.dtype)  # noqa: E731
    minibatch = jax.tree.map(pick, (batch.data, batch.advantages, batch.returns))
    grad = jax.jit(jax.grad(lambda p, *a: learner.loss(agent, config, p, ts.normalizer, *a)[0]))
    hlo = grad.lower(ts.params, *minibatch, jax.random.key(0)).compile().as_text()
    bodies, current = {}, None
    for line in hlo.splitlines():
        if line and not line.startswith(" ") and line.rstrip().endswith("{"):
            current = bodies.setdefault(line.split()[0].lstrip("%"), [])
        elif current is not None and " = " in line:
            current.append(re.search(r"= \S+ ([\w-]+)\(", line))
    trip = f'"known_trip_count":{{"n":"{config.unroll_length}"}}'
    loops = re.findall(r"body=%([\w.-]+),.*" + re.escape(trip), hlo)
    return [sum(1 for m in bodies[b] if m and m.group(1) not in _NOT_KERNELS) for b in loops]


def _call(run, steps: int) -> float:
    """One timed call from the run's initial state (a copy: the trainer donates it).

    Every call of every program starts from the same state, so the 1-epoch and the
    full program roll out the same first iteration; carried from call to call they
    would train apart, end different numbers of episodes and reset differently,
    and their difference would not be the SGD alone."""
    space, ts, es = run
    ts, es = jax.block_until_ready(jax.tree.map(jnp.copy, (ts, es)))
    start = time.perf_counter()
    out = ppo.run_train(space, ts, es, steps)
    jax.block_until_ready(out[:2])
    return time.perf_counter() - start


def main(cfg: Config) -> dict[str, dict[str, float]]:
    if cfg.epochs < 2:
        raise ValueError(f"--epochs must be >= 2 to separate the SGD cost, got {cfg.epochs}")
    labels = {  # row -> (core, strategy)
        (core if len(cfg.strategies) == 1 else f"{core}:{strategy}"): (core, strategy)
        for core in cfg.cores
        for strategy in cfg.strategies
    }
    specs = {s: _strategy(s) for s in cfg.strategies}  # "stock@4" -> ("stock", 4)
    envs = {
        s: make_contextual(cfg.env, C.ContextSpace({}), episode_length=1000, reset_strategy=name)
        for s, (name, _) in specs.items()
    }
    steps = cfg.iterations * cfg.num_envs * cfg.unroll_length
    runs = {
        (label, e): _run(envs[strategy], cfg, core, e, specs[strategy][1])
        for label, (core, strategy) in labels.items()
        for e in (1, cfg.epochs)
    }
    times: dict = {name: [] for name in runs}
    for round_ in range(cfg.rounds + 1):  # round 0 compiles
        for name, run in runs.items():
            elapsed = _call(run, steps)
            if round_:
                times[name].append(elapsed / cfg.iterations * 1e3)
    if cfg.trace_dir:
        for label in labels:
            with jax.profiler.trace(f"{cfg.trace_dir}/{label}"):
                _call(runs[(label, cfg.epochs)], cfg.num_envs * cfg.unroll_length)
        print(f"traces: {cfg.trace_dir}/<row>")
    print(
        f"{jax.devices()[0].device_kind}, {cfg.env}, {cfg.num_envs} envs x {cfg.unroll_length}"
        f" steps, {cfg.num_minibatches} minibatches; ms per iteration, median of {cfg.rounds}"
    )
    w = max(6, *(len(label) + 2 for label in labels))
    print(
        f"{'core':<{w}}{'iteration':>11}{'SGD epoch':>11}{'SGD total':>11}{'rollout+rest':>14}"
        f"{'ops per time step, gradient loops':>36}"
    )
    out = {}
    for label in labels:
        # paired rounds: the differences are taken round by round, then the median
        one, full = (np.asarray(times[(label, e)]) for e in (1, cfg.epochs))
        epochs = (full - one) / (cfg.epochs - 1)
        full, epoch, rest = (float(np.median(x)) for x in (full, epochs, one - epochs))
        ops = loop_ops(runs[(label, cfg.epochs)])
        out[label] = {
            "iteration_ms": full,
            "sgd_epoch_ms": epoch,
            "rollout_rest_ms": rest,
            "loop_ops": ops,
        }
        print(
            f"{label:<{w}}{full:>11.1f}{epoch:>11.1f}{epoch * cfg.epochs:>11.1f}{rest:>14.1f}"
            f"{' + '.join(map(str, ops)) or '-':>36}"
        )
    first, *others = labels
    for label in others:
        ratio = {k: out[label][k] / out[first][k] for k in out[first] if k.endswith("_ms")}
        print(
            f"{label} / {first}: iteration {ratio['iteration_ms']:.2f}x,"
            f" SGD {ratio['sgd_epoch_ms']:.2f}x, rollout+rest {ratio['rollout_rest_ms']:.2f}x"
        )
    return out


if __name__ == "__main__":
    main(tyro.cli(Config))
