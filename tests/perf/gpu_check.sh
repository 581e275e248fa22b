#!/usr/bin/env bash
# The GPU figures in ONE call that fits a lent device (one H100/H200, 15 minutes of device time in all): the perf
# suite's gpu profile (tests/perf/profiles/gpu.yaml: what each run measures, its budget and estimate), the most
# valuable figures first, results in tests/perf/results/gpu/ and, when $OUT is set (the device machine), packed
# into $OUT/gpu-results.tgz. Then, here: unpack it into tests/perf/results/gpu/ and run `python -m tests.perf.report`.
#
# From a session with the device tool, one call (the wheels carried):
#   run(command="bash tests/perf/gpu_check.sh", carry=[".whl"], timeout_s=480)
#
# The plan (`bash tests/perf/gpu_check.sh --plan` prints it with each run's estimate and budget), in this order:
#    1 precision@full-small       0.5B update, bf16: MFU on computed and on logical tokens, the attention path and
#                                 kernels taken, one profiled step (CPU time vs GPU time, the GPU's busy share)
#    2 precision@full-mid         1.5B update, bf16: MFU both ways
#    3 trainer                    workbench step vs trl.GRPOTrainer, TRL's gradient checkpointing off (headline), on
#    4 engine@decode              hf static decode tokens/s, unprofiled (varied lengths, stop strings) and profiled
#    5 precision@full-small-more  0.5B fp32 and bf16+ckpt (ratios against 1's bf16), one fp32 step CPU vs GPU
#    6 data_parallel              the trainer ranks' NCCL path
#    7-9 precision@lora-big, train_step, engine@overhead: only if the time allows
# Estimate (H200, sized from the 2026-11-27 H200 and 2026-11-26 H100 runs): start-up ~150 s (machine start and
# transfer ~120 s, wheel install ~20 s, nvidia-smi and the plan ~10 s), runs 1-6 ~355 s: ~505 s, 8.4 minutes.
# Bound: each run stops at its budget, none starts past GPU_COMMAND_S (420 s) from this script's start less its
# estimate, so the command ends by ~420 s, the call by ~9 minutes. A run stopped keeps what it measured.
#
#   bash tests/perf/gpu_check.sh --fetch-wheels     # here, once: the packages the GPU image lacks, into .whl/
#   bash tests/perf/gpu_check.sh                    # on the GPU machine (carry .whl)
#   bash tests/perf/gpu_check.sh --device cpu       # the same runs on small shapes, on a CPU: a rehearsal (no budgets)
#   bash tests/perf/gpu_check.sh --plan             # the plan and its estimate; runs nothing
# GPU_ONLY=trainer,engine@decode picks and orders runs (names of the profile's plan); GPU_COMMAND_S sets the bound.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
OUT_DIR=tests/perf/results/gpu
COMMAND_S=${GPU_COMMAND_S:-420}  # this script's own seconds: the plan's deadline_s (390) + wheels and plan (30)
case "${1:-}" in
  --fetch-wheels)
    grep -v '^#' tests/perf/gpu_wheels.txt | xargs python3 -m pip download -q --no-deps --only-binary=:all: \
      --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d .whl
    exit $?;;
  --plan)
    PYTHONPATH="$PWD" exec $PY -m tests.perf --profile gpu --plan ${GPU_ONLY:+--only "$GPU_ONLY"};;
  --device)
    [ "${2:-}" = cpu ] || { echo "usage: $0 [--fetch-wheels | --plan | --device cpu]" >&2; exit 2; }
    export PERF_DEVICE=cpu PERF_SMALL=qwen2-mini PERF_MID=qwen2-mini PERF_BIG=qwen2-mini PERF_SAMPLES=8 \
      PERF_PROMPT=32 PERF_COMPLETION=32 PERF_TOKEN_BUDGET=1024 PERF_STEPS=1 PERF_TASKS=4 PERF_MAX_TOKENS=8 \
      PERF_TRL_SAMPLES=8 PERF_TRL_PROMPT=32 PERF_TRL_COMPLETION=32 PERF_TRAIN_STEPS=2 PERF_TRAIN_BATCH=2 \
      PERF_TRAIN_GROUP=2 PERF_RANKS=2
    OUT_DIR=${GPU_REHEARSAL_OUT:-artifacts/perf/gpu-rehearsal};;
  "") nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || exit 1;;
  *) echo "usage: $0 [--fetch-wheels | --plan | --device cpu]" >&2; exit 2;;
esac
if [ -d .whl ] && ! $PY -c 'import trl, pydantic' 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TQDM_DISABLE=1 HF_HUB_OFFLINE=1
mkdir -p "$OUT_DIR"
$PY -m tests.perf --profile gpu --plan ${GPU_ONLY:+--only "$GPU_ONLY"} | tee "$OUT_DIR/plan.txt"
if [ "${PERF_DEVICE:-cuda}" = cpu ]; then
  limits=(--timeout "${GPU_TIMEOUT:-600}")  # the rehearsal: small shapes on a CPU, no GPU budgets
else
  limits=(--budgets --deadline $((COMMAND_S - SECONDS)))  # each run at most its budget; none past the bound
fi
$PY -m tests.perf --profile gpu ${GPU_ONLY:+--only "$GPU_ONLY"} "${limits[@]}" --out "$OUT_DIR"
status=$?
echo "gpu_check: $SECONDS s in this script"
if [ -n "${OUT:-}" ]; then tar czf "$OUT/gpu-results.tgz" -C "$OUT_DIR" .; fi  # '@' cannot travel in a file name
exit $status
