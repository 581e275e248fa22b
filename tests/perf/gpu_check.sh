#!/usr/bin/env bash
# The GPU figures in one command, sized for a 10-minute slot on one H100/H200: the gpu profile of the perf
# suite (tests/perf/profiles/gpu.yaml says what each run measures), results in tests/perf/results/gpu/ and, when
# $OUT is set (the device machine), packed into $OUT/gpu-results.tgz. Then, here: `python -m tests.perf.report`.
#
#   bash tests/perf/gpu_check.sh --fetch-wheels     # here, once: the packages the GPU image lacks, into .whl/
#   bash tests/perf/gpu_check.sh                    # on the GPU machine (carry .whl)
#   bash tests/perf/gpu_check.sh --device cpu       # the same runs on small shapes, on a CPU: a rehearsal
#
# From a session with the device tool, two calls on one warm machine (one 10-minute command each):
#   run(command="GPU_ONLY=precision,trainer timeout 570 bash tests/perf/gpu_check.sh", carry=[".whl"], timeout_s=600)
#   run(command="GPU_ONLY=data_parallel,engine,train_step timeout 570 bash tests/perf/gpu_check.sh", carry=[".whl"], timeout_s=600)
# then unpack each $OUT/gpu-results.tgz into tests/perf/results/gpu/ here and run `python -m tests.perf.report`.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
OUT_DIR=tests/perf/results/gpu
case "${1:-}" in
  --fetch-wheels)
    grep -v '^#' tests/perf/gpu_wheels.txt | xargs python3 -m pip download -q --no-deps --only-binary=:all: \
      --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d .whl
    exit $?;;
  --device)
    [ "${2:-}" = cpu ] || { echo "usage: $0 [--fetch-wheels | --device cpu]" >&2; exit 2; }
    export PERF_DEVICE=cpu PERF_SMALL=qwen2-mini PERF_MID=qwen2-mini PERF_BIG=qwen2-mini PERF_SAMPLES=8 \
      PERF_PROMPT=32 PERF_COMPLETION=32 PERF_TOKEN_BUDGET=1024 PERF_STEPS=1 PERF_TASKS=4 PERF_MAX_TOKENS=8 \
      PERF_TRL_SAMPLES=8 PERF_TRL_PROMPT=32 PERF_TRL_COMPLETION=32 PERF_TRAIN_STEPS=2 PERF_TRAIN_BATCH=2 \
      PERF_MID_VARIANTS=bf16 PERF_BIG_VARIANTS=bf16+ckpt PERF_RANKS=2  # full-small runs all three: one process each is enough
    OUT_DIR=${GPU_REHEARSAL_OUT:-artifacts/perf/gpu-rehearsal};;
  "") nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || exit 1;;
  *) echo "usage: $0 [--fetch-wheels | --device cpu]" >&2; exit 2;;
esac
if [ -d .whl ] && ! $PY -c 'import trl, pydantic' 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TQDM_DISABLE=1 HF_HUB_OFFLINE=1
# GPU_ONLY picks and orders the runs. All four take more than one 10-minute slot: the update's figures (issue 35)
# are GPU_ONLY=precision,trainer, the rollout's (issue 36) GPU_ONLY=data_parallel,engine,train_step (the trainer
# ranks' NCCL path first, issue 39: a minute); run them as two calls.
$PY -m tests.perf --profile gpu --only "${GPU_ONLY:-precision,trainer,data_parallel,engine,train_step}" --timeout "${GPU_TIMEOUT:-200}" \
  --out "$OUT_DIR"
status=$?
if [ -n "${OUT:-}" ]; then tar czf "$OUT/gpu-results.tgz" -C "$OUT_DIR" .; fi  # '@' cannot travel in a file name
exit $status
