"""PPO throughput and return: metarl (mlp, gru) against Brax's own PPO.

Same env, same data per update: `num_envs` envs unroll `unroll_length` steps,
the batch is split into `num_minibatches` minibatches, `num_updates_per_batch`
epochs (Brax: batch_size = num_envs / num_minibatches, so one unroll of every
env feeds one update round), same network sizes, learning rate, entropy cost,
discount, GAE lambda, clipping, observation normalisation. The env has no
varying context (an empty ContextSpace for metarl), so the trainers are
compared, not the randomisation.

Reported per trainer, in one run: steady training env-steps/s, compile time
(wall time minus steps / steady speed), and the deterministic evaluation return
of the final policy at the same step budget (Brax: its own evaluator; metarl:
`metarl.evaluation`, both over full-length episodes).

Brax 0.14.2's PPO calls `jax.device_put_replicated`, which JAX 0.10 removed
from its public API; this benchmark re-exposes it (one line, benchmark only).

    python benchmarks/ppo_throughput.py --num-timesteps 1_000_000
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import numpy as np
import tyro

from metarl import contexts as C
from metarl import evaluation as E
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
    seed: int = 0
    gru: bool = True  # also time metarl's GRU agent


POLICY, VALUE = (32, 32), (64, 64)


def brax_ppo(cfg: Config) -> dict:
    from brax import envs as brax_envs
    from brax.training.agents.ppo import networks as ppo_networks
    from brax.training.agents.ppo import train as brax_train

    times, rewards, sps = [], [], []

    def progress(step, metrics):
        times.append(time.perf_counter())
        if "eval/episode_reward" in metrics:
            rewards.append(float(metrics["eval/episode_reward"]))
        if "training/sps" in metrics:
            sps.append(float(metrics["training/sps"]))

    start = time.perf_counter()
    brax_train.train(
        environment=brax_envs.get_environment(cfg.env),
        num_timesteps=cfg.num_timesteps,
        episode_length=cfg.episode_length,
        num_envs=cfg.num_envs,
        batch_size=cfg.num_envs // cfg.num_minibatches,
        num_minibatches=cfg.num_minibatches,
        num_updates_per_batch=cfg.num_updates_per_batch,
        unroll_length=cfg.unroll_length,
        learning_rate=cfg.learning_rate,
        entropy_cost=cfg.entropy_cost,
        discounting=cfg.discounting,
        gae_lambda=0.95,
        clipping_epsilon=0.3,
        max_grad_norm=1.0,
        normalize_observations=True,
        num_evals=cfg.segments + 1,
        num_eval_envs=cfg.eval_episodes,
        deterministic_eval=True,
        seed=cfg.seed,
        network_factory=functools.partial(
            ppo_networks.make_ppo_networks,
            policy_hidden_layer_sizes=POLICY,
            value_hidden_layer_sizes=VALUE,
        ),
        progress_fn=progress,
    )
    total = time.perf_counter() - start
    steady = float(np.median(sps[2:] or sps))  # Brax compiles its epoch twice
    return {
        "steps_per_sec": steady,
        "compile_s": total - cfg.num_timesteps / steady,
        "return": rewards[-1],
    }


def metarl_ppo(cfg: Config, core: str) -> dict:
    env = make_contextual(cfg.env, C.ContextSpace({}), episode_length=cfg.episode_length)
    config = ppo.PPOConfig(
        num_envs=cfg.num_envs,
        unroll_length=cfg.unroll_length,
        num_minibatches=cfg.num_minibatches,
        num_updates_per_batch=cfg.num_updates_per_batch,
        learning_rate=cfg.learning_rate,
        entropy_cost=cfg.entropy_cost,
        discounting=cfg.discounting,
        core=core,
        hidden_size=32,
        policy_hidden=POLICY,
        value_hidden=VALUE,
        rl2_inputs=core != "mlp",
        seed=cfg.seed,
    )
    start = time.perf_counter()
    space, ts, history = ppo.train(env, config, cfg.num_timesteps, segments=cfg.segments)
    total = time.perf_counter() - start
    steady = float(np.median([m["env_steps_per_sec"] for m in history[1:]]))
    evaluator = E.Evaluator(env, episodes=cfg.eval_episodes, max_contexts=1)
    result = evaluator.evaluate(
        ppo.make_policy(space, ts), E.ContextSet("train", {}), jax.random.key(cfg.seed)
    )
    return {
        "steps_per_sec": steady,
        "compile_s": total - history[-1]["env_steps"] / steady,
        "return": float(result.mean[0]),
    }


def main(cfg: Config) -> None:
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {cfg}")
    trainers = {"brax_ppo": brax_ppo, "metarl_mlp": lambda c: metarl_ppo(c, "mlp")}
    if cfg.gru:
        trainers["metarl_gru"] = lambda c: metarl_ppo(c, "gru")
    results = {}
    for name, train in trainers.items():
        results[name] = train(cfg)
        print(f"{name}: {results[name]}", flush=True)
    base = results["brax_ppo"]
    print(f"\n{'trainer':<12}{'steps/s':>10}{'vs brax':>9}{'compile s':>11}{'eval return':>13}")
    for name, r in results.items():
        ratio = r["steps_per_sec"] / base["steps_per_sec"]
        print(
            f"{name:<12}{r['steps_per_sec']:>10,.0f}{ratio:>9.2f}"
            f"{r['compile_s']:>11.1f}{r['return']:>13.1f}"
        )
    if cfg.gru:
        ratio = results["metarl_gru"]["steps_per_sec"] / results["metarl_mlp"]["steps_per_sec"]
        print(f"gru / mlp throughput: {ratio:.2f}")


if __name__ == "__main__":
    main(tyro.cli(Config))
