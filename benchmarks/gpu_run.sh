#!/usr/bin/env bash
# The GPU measurements still open in issue 8, in stages that each fit one call of
# the device tool (10 minutes a call, 30 minutes a session). From the repository
# root on the GPU machine, with the wheels of ../shared/tools/gpu-wheels carried
# in .whl/ (installed on first use):
#
#   bash benchmarks/gpu_run.sh env          # 8192 envs: plain, Brax DR, auto (the stock), dense;
#                                           # on MJX auto and the pool (~7 min)
#   bash benchmarks/gpu_run.sh poolcost     # hopper: where the pool's last 5% goes (~4 min)
#   bash benchmarks/gpu_run.sh ppo 0 1 2    # PPO vs Brax PPO at the issue's settings (~5 min)
#   STRATEGY=stock bash benchmarks/gpu_run.sh ppo 0   # and metarl's mlp with the stock
#   bash benchmarks/gpu_run.sh ppo 3 4 benchmarks/results/ppo_seeds_0_1_2.json   # + merge
#   bash benchmarks/gpu_run.sh profile      # where PPO's time goes (trace), two-device test
#   bash benchmarks/gpu_run.sh repro        # same seed in fresh processes: same numbers? (~8 min)
#   bash benchmarks/gpu_run.sh resume       # a resumed run logs bit for bit what one run logs
#   bash benchmarks/gpu_run.sh targets      # first in a 15-min device budget (~8 min): issue 8's
#                                           # env table in one call: hopper, ant, inverted_pendulum
#                                           # (generalized) and ant (mjx) at 8192 envs, plain,
#                                           # Brax DR and auto (the stock), 8 rounds (MJX: 6)
#   bash benchmarks/gpu_run.sh essential    # a 15-min device budget's one call (~9.5 min): the
#                                           # runner's resume, ant (mjx) at 8192 envs with auto
#                                           # (the stock) and Brax DR, PPO against Brax PPO over
#                                           # seeds 7 and 8 (auto, the stock)
#   bash benchmarks/gpu_run.sh refill       # ant (mjx) at 8192 and PPO's iteration: the stock
#                                           # refilled in whole chunks against a refill per block
#   bash benchmarks/gpu_run.sh stock        # the four envs at 8192 (ant also on MJX): plain,
#                                           # Brax DR, Brax DR with metarl's Systems, auto
#   bash benchmarks/gpu_run.sh suite        # the whole test suite under the machine's JAX, on its
#                                           # CPU, 12 workers (pytest-xdist and execnet wheels:
#                                           # ../shared/tools/gpu-wheels pytest-xdist==3.8.0
#                                           # execnet==2.1.2)
#   bash benchmarks/gpu_run.sh depth        # PPO's iteration with a stock of 16, 4, 1 (~4 min)
#   bash benchmarks/gpu_run.sh diagnose     # ant (mjx): plain, Brax DR (and two diagnostics
#                                           # of it), auto: every kernel per env step, by
#                                           # MJX's stage; traces and HLO kept (~4 min)
#   bash benchmarks/gpu_run.sh graphs       # hopper, inverted_pendulum at 8192: plain and
#                                           # auto, with XLA's default CUDA graphs and with
#                                           # every run of kernels in one (~5 min)
#   bash benchmarks/gpu_run.sh headline     # hopper's pool (--strategy pool), its cond guard,
#                                           # without derived constants; ant mjx dense, with
#                                           # and without them (~5 min)
#   bash benchmarks/gpu_run.sh first        # then at once (~8 min): time to the first update
#                                           # (sequential, its noreset diagnostic,
#                                           # ppo.precompile, Brax PPO), then
#                                           # PPO vs Brax PPO (3 seeds, mlp)
#
# Results land in $OUT (the device tool brings them back; copy a ppo JSON into the
# tree to merge it in the next call); each stage ends with its tables. Every
# command has its own time limit, so one that hangs costs its share, not the call.
# SMOKE=1 shrinks every size, to check the script on a CPU in a few minutes.
set -uo pipefail
stage=${1:?"usage: gpu_run.sh targets | essential | refill | suite | stock | depth | diagnose | graphs | headline | first | env | poolcost | ppo SEED... [MERGE.json] | profile | repro | resume"}
shift
out=${OUT:-/tmp/gpu_run}
mkdir -p "$out"
if [ -d .whl ] && ! python3 -c "import brax" 2>/dev/null; then
  [ -d /tmp/site/brax ] || python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
smoke=${SMOKE:-0}
python3 -c "import jax; print('jax', jax.__version__, jax.devices())"

run() {  # run LIMIT_S NAME COMMAND...: COMMAND's output to the screen and $out/run.log
  # (one log: the device tool brings back at most 8 files)
  local limit=$1 name=$2
  shift 2
  echo "== $name: $*" | tee -a "$out/run.log"
  timeout "$limit" "$@" 2>&1 | tee -a "$out/run.log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || echo "== $name exited with $rc (124: past its ${limit} s)" | tee -a "$out/run.log"
}

case $stage in
targets)
  # Issue 8's targets at 8192 envs, in one call: every env at least 0.97x of plain Brax
  # and at Brax DR's speed. The figures so far come from four sessions and other code:
  # hopper's 0.967x from 3 rounds that spread 0.926-0.995, the others from 3-4. Here
  # the code of one commit, plain, Brax's static DR and auto (the stock of 32), 8 rounds
  # of 200 steps (MJX's ant: 6 of 192, 12 blocks of the stock), the rollout returning
  # its state as PPO's does; each env its own process and time limit
  if [ "$smoke" = 1 ]; then b=(--num-envs 64 --steps 32 --rounds 2) envs=(inverted_pendulum)
    m=(--num-envs 64 --steps 32 --rounds 2) mjx=(inverted_pendulum)
  else b=(--num-envs 8192 --steps 200 --rounds 8) envs=(hopper ant inverted_pendulum)
    m=(--num-envs 8192 --steps 192 --rounds 6) mjx=(ant); fi
  # limits from the H200's compile and round times (hopper ~105 s, ant ~120 s,
  # inverted_pendulum ~95 s, ant on MJX ~105 s expected): 570 s in all, under a call's 600
  declare -A limit=([hopper]=140 [ant]=170 [inverted_pendulum]=120)
  for e in "${envs[@]}"; do
    run "${limit[$e]}" "targets_$e" python3 benchmarks/env_throughput.py "${b[@]}" --envs "$e" \
      --variants plain brax_dr contextual --out "$out/targets_$e"
  done
  run 140 "targets_${mjx[0]}_mjx" python3 benchmarks/env_throughput.py "${m[@]}" \
    --envs "${mjx[@]}" --backend mjx --variants plain brax_dr contextual \
    --out "$out/targets_${mjx[0]}_mjx"
  ;;
essential)
  # Issue 8's open GPU figures in one call (about 9.5 min on the slow H200 of 2026-11-27).
  # Since that machine's third session "auto" is the stock on MJX too (ant, 8192 envs:
  # 0.967x of plain MJX, dense 0.940x, in one run of 96 steps x 4 rounds). Here: the
  # runner's resume on a GPU (the thinned stock, restocked: bit for bit?); ant (mjx)
  # again, in longer rounds, auto (the stock) against Brax's static DR (1.06x of plain
  # MJX on the H200, by the rollout that did not return its state; dense, 0.94x, is
  # left out to keep the call's time); then PPO against Brax PPO
  # over seeds 7 and 8 (seeds 0-6 so far: no return difference, -60 [-314, 194]), with
  # auto (the stock); whatever the call's time leaves of it
  if [ "$smoke" = 1 ]; then m=(--envs inverted_pendulum --num-envs 64 --steps 16 --rounds 2)
    settings=(--env inverted_pendulum --num-envs 128 --num-minibatches 4 --num-timesteps 20000)
  else m=(--envs ant --num-envs 8192 --steps 192 --rounds 4)
    settings=(--env hopper --num-envs 2048 --unroll-length 16 --num-minibatches 16
      --num-timesteps 2000000)
  fi
  run 150 resume python3 -m pytest -q tests/test_runner.py -k resumed_run_logs_exactly
  run 190 env_8192_mjx python3 benchmarks/env_throughput.py "${m[@]}" --backend mjx \
    --variants plain brax_dr contextual --out "$out/env_8192_mjx"
  # auto alone (the stock): with the pool beside it, the third session's seed 5 ran past
  # the stage's 250 s
  run 250 ppo python3 benchmarks/ppo_throughput.py "${settings[@]}" --no-gru --seeds 7 8 \
    --compile-cache --out "$out/ppo_seeds_7_8.json"
  ;;
refill)
  # The stock's refills in whole chunks (2026-12-04, `refill_stocks`): a stock of 32 per
  # env refilled, before each block of 16 steps, only where some env holds fewer than 16,
  # against the stock of 16 refilled before every block (as the H200 timed it at 0.969x
  # of plain Brax on ant (mjx), 8192 envs, that day; its entries packed per dtype since
  # 2026-12-05, one gather a step and one scatter per refill trip per dtype, not one per
  # array of the state). Beside them brax_dr_metarl (2026-12-05): Brax's DR with the
  # Systems metarl's contexts write (the mass's inertia and the solver's inverse weights
  # batched too), which splits auto's distance to brax_dr into what metarl's physics
  # costs and what its resampling and exact resets cost. Then PPO's iteration
  # (hopper, 2048 envs, the issue's settings) with the new default stock (32) against
  # a stock of 16, in paired rounds
  if [ "$smoke" = 1 ]; then m=(--envs inverted_pendulum --num-envs 64 --steps 32 --rounds 2)
    d=(--env inverted_pendulum --num-envs 64 --num-minibatches 4 --rounds 1 --iterations 2)
  else m=(--envs ant --num-envs 8192 --steps 192 --rounds 5)
    d=(--env hopper --num-envs 2048 --num-minibatches 16 --iterations 4 --rounds 5)
  fi
  run 280 env_8192_mjx_refill python3 benchmarks/env_throughput.py "${m[@]}" --backend mjx \
    --variants plain brax_dr brax_dr_metarl contextual_stock:16 contextual \
    --out "$out/env_8192_mjx_refill"
  run 280 ppo_refill python3 benchmarks/ppo_profile.py "${d[@]}" --cores mlp \
    --strategies stock@16 stock
  ;;
suite)
  # The tests under JAX 0.11.2, which the registry of the CPU machines does not have: on
  # 2026-12-04 every test died there before its first line (tests/conftest.py added a flag
  # that XLA no longer knows), so nothing but the three tests run by hand has passed
  # under it since 2026-11-28. On the machine's CPU (JAX_PLATFORMS=cpu: the tests are
  # written for a CPU's numbers), 12 workers by test file
  if [ "$smoke" = 1 ]; then t=(tests/test_compilation.py) n=2; else t=() n=12; fi
  run 560 suite env JAX_PLATFORMS=cpu python3 -m pytest -q -n "$n" --dist loadfile \
    --durations=15 "${t[@]}"
  ;;
stock)
  # The call of 2026-11-27 (H200): the four envs at 8192 envs, plain, Brax DR, auto and
  # the stock (reset_strategy="stock": 16 fresh states per env refilled before every 16
  # steps, as PPO's rollout steps it). It ran past its limits there: hopper and
  # inverted_pendulum were measured in a second call, without Brax DR. Since
  # 2026-12-05 brax_dr_metarl (Brax's DR with the Systems metarl writes) in the place of
  # contextual_stock, which auto now is on a GPU (a stock of --stock-depth, 32)
  if [ "$smoke" = 1 ]; then b=(--num-envs 64 --steps 20 --rounds 2) envs=(inverted_pendulum)
    m=(--num-envs 64 --steps 32 --rounds 2) mjx=(inverted_pendulum)
  # 8 rounds (was 4): hopper's 3 rounds of 2026-11-27 spread from 0.926 to 0.995
  else b=(--num-envs 8192 --steps 200 --rounds 8) envs=(hopper ant inverted_pendulum)
    m=(--num-envs 8192 --steps 192 --rounds 6) mjx=(ant); fi
  for e in "${envs[@]}"; do
    run 200 "env_8192_$e" python3 benchmarks/env_throughput.py "${b[@]}" --envs "$e" \
      --variants plain brax_dr brax_dr_metarl contextual --out "$out/env_8192_$e"
  done
  # the fourth env, ant on MJX (until 2026-12-07 this stage ran only the three above);
  # 192 steps: whole blocks of the stock's 16
  run 200 "env_8192_${mjx[0]}_mjx" python3 benchmarks/env_throughput.py "${m[@]}" \
    --envs "${mjx[@]}" --backend mjx --variants plain brax_dr brax_dr_metarl contextual \
    --out "$out/env_8192_${mjx[0]}_mjx"
  ;;
headline)
  # What issue 8 still lacks, for a session lent 15 minutes of device time (machine
  # start included; follow with "first" in the same session): hopper at 8192 envs,
  # the one env below 0.97x; ant on MJX (dense, no platform switch since 2026-11-26)
  if [ "$smoke" = 1 ]; then h=(--envs inverted_pendulum --num-envs 64 --steps 20 --rounds 3)
    m=(--envs inverted_pendulum --num-envs 64 --steps 10 --rounds 2)
  else h=(--envs hopper --num-envs 8192 --steps 300 --rounds 5)
    m=(--envs ant --num-envs 8192 --steps 100 --rounds 4); fi
  # On the H100 of 2026-11-26 (evening) every contextual hopper variant compiled in about
  # 30 s and seven of them ran past 200 s: four here, all the pool (--strategy pool: on
  # a GPU "auto" is the stock since 2026-11-27, and until 2026-12-07 this stage timed the
  # stock under the pool's names). contextual_pool_cond: the pool's refill decided by
  # lax.cond, not a 0-or-1-trip loop whose predicate the host reads at every step.
  # contextual_firstorder: the pool without derived constants (the cost of deriving them)
  run 220 env_8192_hopper python3 benchmarks/env_throughput.py "${h[@]}" --strategy pool \
    --variants plain contextual_pool contextual_firstorder contextual_pool_cond \
    --out "$out/env_8192_hopper"
  # MJX's dense resets, which derive the constants at every step, with and without them
  run 150 env_8192_mjx python3 benchmarks/env_throughput.py "${m[@]}" --backend mjx \
    --strategy dense --variants plain contextual_dense contextual_firstorder \
    --out "$out/env_8192_mjx"
  ;;
diagnose)
  # Where ant on MJX loses its time on a GPU, against plain Brax, Brax's static DR and
  # Brax's DR with the Systems metarl writes (brax_dr_metarl: the contextual env without
  # its resampling and exact resets; in the GPU's program it launches what Brax DR
  # launches, 2026-12-05): every kernel of one rollout per variant, per env step by HLO
  # operation and by MJX's stage (--profile), and the raw traces and compiled HLO
  # (trace_*.tgz, hlo.tgz), to read on a CPU afterwards (~4 min). Until 2026-12-05 it
  # ran brax_dr_same and brax_dr_every in its place, for a question since answered: DR's
  # 1.06x of plain Brax came from a rollout that did not return its state. Seven files
  # come back: the log, the JSON, the HLO and four traces
  if [ "$smoke" = 1 ]; then m=(--envs inverted_pendulum --num-envs 64 --steps 8 --rounds 2)
  else m=(--envs ant --num-envs 8192 --steps 32 --rounds 2); fi
  run 300 mjx_profile python3 benchmarks/env_throughput.py "${m[@]}" --backend mjx \
    --variants plain brax_dr brax_dr_metarl contextual --profile --profile-rounds 2 \
    --trace-dir /tmp/traces --dump-hlo /tmp/hlo --out "$out/mjx_profile"
  tar czf "$out/hlo.tgz" -C /tmp hlo
  for t in /tmp/traces/*; do  # one file each: the device tool brings back 16 MiB a file
    tar czf "$out/trace_$(basename "$t").tgz" -C /tmp/traces --exclude '*.trace.json.gz' \
      "$(basename "$t")"
  done
  ;;
env)
  if [ "$smoke" = 1 ]; then sizes=(--num-envs 64 --steps 10 --rounds 2); envs=(inverted_pendulum)
    long=(--num-envs 64 --steps 20 --rounds 3)
  else sizes=(--num-envs 8192 --steps 100 --rounds 5); envs=(ant inverted_pendulum)
    long=(--num-envs 8192 --steps 300 --rounds 7); fi
  # "contextual" is reset_strategy="auto": the stock on a GPU (until 2026-11-27 the pool on
  # Brax's backends, dense on MJX)
  variants=(plain brax_dr contextual contextual_dense)
  # hopper's rounds of 100 steps lasted 0.46 s on the H100 (ratios spread 0.77-1.06):
  # longer rounds, and more of them
  [ "$smoke" = 1 ] && hopper=(inverted_pendulum) || hopper=(hopper)
  run 180 env_8192_hopper python3 benchmarks/env_throughput.py --envs "${hopper[@]}" \
    "${long[@]}" --variants "${variants[@]}" --out "$out/env_8192_hopper"
  run 240 env_8192 python3 benchmarks/env_throughput.py --envs "${envs[@]}" "${sizes[@]}" \
    --variants "${variants[@]}" --out "$out/env_8192"
  [ "$smoke" = 1 ] && mjx=(inverted_pendulum) || mjx=(ant)
  run 150 env_8192_mjx python3 benchmarks/env_throughput.py --envs "${mjx[@]}" --backend mjx \
    "${sizes[@]}" --variants plain brax_dr contextual contextual_pool --out "$out/env_8192_mjx"
  ;;
poolcost)
  # The pool's cost split three ways (env_throughput.py's docstring): carrying its
  # entry (noreset - norefill), its refills (refills/step x (noreset - dense)) and
  # the per-step check whether to refill (the rest: on a GPU a loop waits on the host)
  if [ "$smoke" = 1 ]; then args=(--envs inverted_pendulum --num-envs 64 --steps 20 --rounds 3)
  else args=(--envs hopper --num-envs 8192 --steps 300 --rounds 7); fi
  run 300 poolcost python3 benchmarks/env_throughput.py "${args[@]}" --variants plain \
    contextual_pool contextual_dense ablate_noreset ablate_norefill --out "$out/poolcost"
  ;;
first)
  # The time to the first update in fresh processes: the programs compiled one after the
  # other, at once (ppo.precompile, which ppo.train and ppo_throughput now use), and Brax
  # PPO's; then PPO against Brax PPO (3 seeds, mlp only: the gru's 0.73x was measured on
  # the H100)
  if [ "$smoke" = 1 ]; then
    settings=(--env inverted_pendulum --num-envs 128 --num-minibatches 4 --num-timesteps 20000)
    first=(--env inverted_pendulum --num-envs 128 --num-minibatches 4 --rounds 1)
  else
    settings=(--env hopper --num-envs 2048 --unroll-length 16 --num-minibatches 16
      --num-timesteps 2000000)
    first=(--env hopper --num-envs 2048 --unroll-length 16 --num-minibatches 16 --rounds 1)
  fi
  # first_update.py's "brax" variant: Brax PPO's own time to its first update, in a
  # fresh process like metarl's (2 CPU cores, hopper: 20.2 s against metarl's 27.9 s,
  # 19.8 s for metarl's noreset diagnostic: the gap there is the exact reset's compile)
  run 240 first_update python3 benchmarks/first_update.py "${first[@]}" \
    --strategies noreset --out "$out/first_update.json"
  run 330 ppo python3 benchmarks/ppo_throughput.py "${settings[@]}" --no-gru --seeds 0 1 2 \
    --compile-cache --out "$out/ppo_seeds_0_1_2.json"
  ;;
ppo)
  seeds=() merge=()
  for a in "$@"; do [[ $a == *.json ]] && merge+=("$a") || seeds+=("$a"); done
  [ ${#seeds[@]} -gt 0 ] || { echo "ppo: give the seeds to train"; exit 2; }
  if [ "$smoke" = 1 ]; then
    settings=(--env inverted_pendulum --num-envs 128 --num-minibatches 4 --num-timesteps 20000)
  else
    settings=(--env hopper --num-envs 2048 --unroll-length 16 --num-minibatches 16
      --num-timesteps 2000000)
  fi
  [ ${#merge[@]} -gt 0 ] && settings+=(--merge "${merge[@]}")
  # STRATEGY=stock: also metarl's mlp with that reset strategy (trainer metarl_mlp_stock)
  [ -n "${STRATEGY:-}" ] && settings+=(--strategy "$STRATEGY")
  run 570 ppo python3 benchmarks/ppo_throughput.py "${settings[@]}" --seeds "${seeds[@]}" \
    --compile-cache --out "$out/ppo_seeds_$(IFS=_; echo "${seeds[*]}").json"
  ;;
depth)
  # What a shallower stock costs in PPO's own loop: PPOConfig.stock_depth, which a device
  # short of memory gets (the largest divisor of unroll_length whose stock fits a quarter
  # of its memory), refilled every stock_depth steps. Hopper at the issue's settings, a
  # stock of 16 (unroll_length) against 4 and 1, in paired rounds (ppo_profile.py; until
  # 2026-12-07 the first was plain "stock", the default depth of 32, not 16)
  if [ "$smoke" = 1 ]; then
    d=(--env inverted_pendulum --num-envs 64 --num-minibatches 4 --rounds 1 --iterations 2)
  else
    d=(--env hopper --num-envs 2048 --num-minibatches 16 --iterations 4 --rounds 5)
  fi
  run 400 depth python3 benchmarks/ppo_profile.py "${d[@]}" --cores mlp \
    --strategies stock@16 stock@4 stock@1
  ;;
graphs)
  # XLA leaves a run of fewer than 5 kernels outside its CUDA graphs, each kernel then
  # launched alone by the host. Compiled for an H100 (gpu_program.py, 2026-11-28), the
  # host launches 816 graphs and kernels a hopper step (plain Brax; the stock 820) and
  # 320 (326) with every run in a graph; inverted_pendulum 1626 (the stock 1833: XLA
  # leaves one more kernel of its solver loop outside) and 1426 (1430). Is the host
  # what bounds these envs at 8192 on a GPU? Each setting in its own process (XLA_FLAGS
  # is read once): its ratios side by side, its steps/s against the other process's
  if [ "$smoke" = 1 ]; then g=(--envs inverted_pendulum --num-envs 64 --steps 16 --rounds 2)
  else g=(--envs hopper inverted_pendulum --num-envs 8192 --steps 100 --rounds 3); fi
  run 240 graphs_default python3 benchmarks/env_throughput.py "${g[@]}" \
    --variants plain contextual --out "$out/graphs_default"
  run 240 graphs_all env XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_graph_min_graph_size=1" \
    python3 benchmarks/env_throughput.py "${g[@]}" --variants plain contextual \
    --out "$out/graphs_all"
  ;;
profile)
  if [ "$smoke" = 1 ]; then
    profile=(--env inverted_pendulum --num-envs 64 --num-minibatches 4 --rounds 1 --iterations 2)
  else
    profile=(--env hopper --num-envs 2048 --num-minibatches 16)
  fi
  run 400 profile python3 benchmarks/ppo_profile.py "${profile[@]}" --trace-dir /tmp/ppo_trace
  tar czf "$out/ppo_trace.tgz" -C /tmp ppo_trace
  run 120 two_devices env JAX_PLATFORMS=cpu python3 -m pytest -q tests/test_ppo.py -k two_devices
  ;;
repro)
  [ "$smoke" = 1 ] && repro=(--num-envs 64 --num-timesteps 6000) || repro=(--num-envs 256)
  deterministic=xla_gpu_deterministic_ops=true
  # 4 fresh processes of about 100 s each on the H100 (mostly compilation)
  run 540 reproducibility python3 benchmarks/reproducibility.py "${repro[@]}" \
    --settings default "$deterministic" --out "$out/reproducibility.json"
  ;;
resume)
  # In one process: a run killed after 2 segments and resumed must log, bit for bit,
  # what an uninterrupted run logs (tests/test_runner.py), without and with the switch
  # (passed on the H100 on 2026-11-24, 78 s each; since 2026-11-27 the test trains with
  # the stock, checkpointed thinned and restocked on resume: not yet run on a GPU)
  deterministic=xla_gpu_deterministic_ops=true
  resumed=(python3 -m pytest -q tests/test_runner.py -k resumed_run_logs_exactly)
  run 200 resume "${resumed[@]}"
  run 200 resume_deterministic env XLA_FLAGS="${XLA_FLAGS:-} --$deterministic" "${resumed[@]}"
  ;;
*)
  echo "unknown stage $stage: targets, essential, suite, stock, depth, diagnose, graphs, headline, first, env, poolcost, ppo, profile, repro or resume"
  exit 2
  ;;
esac
