#!/usr/bin/env bash
# One command that checks this project on the machine it runs on and writes one Markdown report.
#
#   bash scripts/device_check.sh [OUTDIR]        # default bench/device_check; report: OUTDIR/device_check.md
#
# Steps, each timed, logged to OUTDIR/logs/<step>.log and capped by its own time limit; a failing step is recorded
# and the next one runs; the exit code is 1 when any step failed or timed out:
#   environment     backend, devices, versions, commit                    -> OUTDIR/environment.json
#   attention       scripts/bench_attention.py in bfloat16 (+ cuDNN row)  -> OUTDIR/bench_attention.{md,csv,png}
#   train_default   scripts/bench_train.py, default model, bfloat16       -> OUTDIR/bench_train_default.{json,md}
#   train_large     the 209M model: d_model 1024, 6+6 layers, 64 x 512    -> OUTDIR/bench_train_large.{json,md}
#   loop            scripts/bench_train.py --loop (skipped if it has none) -> OUTDIR/bench_loop.{json,md}
#   numbers_1seed   python -m attn_lab.train, numbers quick, one seed     -> OUTDIR/numbers_1seed/results.json
#   numbers_8seeds  the same, 8 vmapped seeds (--seeds 0,...,7)            -> OUTDIR/numbers_8seeds/seed=*/
#   fused           scripts/fused_check.py: the fused kernels' compile matrix and 16K timings (--smoke off a GPU)
#                                                                          -> OUTDIR/fused.json
#   tests           pytest on the GPU-relevant test files                 -> OUTDIR/tests.xml
# The benchmarks run before the tests so that a slow suite cannot cost the measurements.
#
# Sizes follow the backend: 'full' on a GPU/TPU (attention at 1K/4K/16K/64K, the sizes above, the whole test
# files; meant to finish in under 8 minutes on one H200), 'cpu' on a CPU (lengths 256/512, tiny models, 20 numbers
# steps at batch 16, three tests: ~4 minutes on 2 free cores) and 'tiny' on request (the smoke test's).
# Environment: DEVICE_CHECK_SIZE=full|cpu|tiny overrides the choice; DEVICE_CHECK_STEPS=attention,loop,... runs only
# those steps and keeps the other steps' earlier results in OUTDIR's report (so a check can be split over several
# calls); DEVICE_CHECK_PYTEST_ARGS replaces the test step's pytest arguments; DEVICE_CHECK_ATTENTION_ARGS is appended
# to bench_attention's (e.g. "--time-budget 60"); PYTHON picks the interpreter (default python3). The repository goes
# first on PYTHONPATH, so nothing needs installing beyond the dependencies.
set -u
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/bench/device_check}"
PY="${PYTHON:-python3}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export WANDB_MODE=disabled TF_CPP_MIN_LOG_LEVEL=2
mkdir -p "$OUT/logs" && OUT="$(cd "$OUT" && pwd)"
[ -n "${DEVICE_CHECK_STEPS:-}" ] || : > "$OUT/steps.jsonl"  # a full run starts a fresh report
REPORT=("$PY" "$ROOT/scripts/device_report.py")

BACKEND="$("$PY" -c 'import jax; print(jax.default_backend())' 2>/dev/null || echo none)"
SIZE="${DEVICE_CHECK_SIZE:-$(case "$BACKEND" in cpu|none) echo cpu;; *) echo full;; esac)}"
case "$SIZE" in full|cpu|tiny) ;; *) echo "error: DEVICE_CHECK_SIZE must be full, cpu or tiny, got '$SIZE'" >&2; exit 2;; esac
printf '{"size": "%s", "backend": "%s"}\n' "$SIZE" "$BACKEND" > "$OUT/plan.json"
echo "device check: backend $BACKEND, sizes '$SIZE', report $OUT/device_check.md"

wanted() {  # wanted STEP: true when DEVICE_CHECK_STEPS is unset or names STEP
  [ -z "${DEVICE_CHECK_STEPS:-}" ] || [[ ",$DEVICE_CHECK_STEPS," == *",$1,"* ]]
}

outputs() {  # outputs STEP: the files STEP writes under OUT, removed before it runs so nothing stale is reported
  case "$1" in
    environment) echo "$OUT/environment.json";;
    attention) echo "$OUT"/bench_attention.*;;
    train_*) echo "$OUT/bench_$1".*;;
    loop) echo "$OUT"/bench_loop*;;
    numbers_*) echo "$OUT/$1";;  # the trainer would resume an existing workdir
    fused) echo "$OUT/fused.json";;
    tests) echo "$OUT/tests.xml";;
  esac
}

step() {  # step NAME LIMIT_SECONDS CMD...: runs CMD in the repo root, timed and logged; records; rewrites the report
  local name="$1" limit="$2" start end rc
  shift 2
  wanted "$name" || return 0
  rm -rf $(outputs "$name") "$OUT/logs/$name.log"
  echo "== $name (limit ${limit}s): $*"
  start="$(date +%s.%N)"
  (cd "$ROOT" && timeout -k 10 "$limit" "$@") > "$OUT/logs/$name.log" 2>&1
  rc=$?
  end="$(date +%s.%N)"
  "${REPORT[@]}" record "$OUT" "$name" "$rc" "$start" "$end" "$limit" -- "$@"
  "${REPORT[@]}" write "$OUT" > /dev/null  # a run killed later still leaves a report of what finished
  echo "   rc $rc in $(awk "BEGIN {printf \"%.1f\", $end - $start}") s"
}

skip() {  # skip NAME REASON
  wanted "$1" || return 0
  echo "== $1: skipped ($2)"
  "${REPORT[@]}" skip "$OUT" "$1" "$2"
}

# --- sizes -----------------------------------------------------------------------------------------------------
TEST_FILES=$(cd "$ROOT" && ls tests/test_attention.py tests/test_kernels_*.py tests/test_kernel_*.py tests/test_models.py \
             tests/test_diversity.py tests/test_dispatch.py 2>/dev/null | tr '\n' ' ')
NUMBERS=(--config configs/numbers.py:quick --config.wandb.mode=disabled)
case "$SIZE" in
  full)
    ATTN=(--lengths 1024,4096,16384,65536 --batch 4 --max-gib 120 --repeats 10 --case-seconds 10 --time-budget 150)
    ATTN_ENV=(env XLA_PYTHON_CLIENT_MEM_FRACTION=0.95)  # XLA's attention at 16K needs ~80 GiB of the H200's 141
    TRAIN_DEFAULT=()
    TRAIN_LARGE=(--d-model 1024 --layers 6 --batch 64 --length 512)
    LOOP=()
    NUMBERS_SHORT=()
    PYTEST_ARGS=($TEST_FILES)
    FUSED=(); [ "$BACKEND" = gpu ] || FUSED=(--smoke)  # the compile matrix needs a CUDA GPU
    LIMITS=(240 90 150 150 90 150 300 420)  # attention train_default train_large loop numbers_1 numbers_8 tests fused
    ;;
  cpu)
    ATTN_ENV=()
    ATTN=(--lengths 256,512 --batch 1 --kernels dense,local,linear --repeats 2 --time-budget 60)
    TRAIN_DEFAULT=(--d-model 64 --layers 1 --heads 4 --batch 8 --length 32 --vocab 500 --steps 4 --peak-sizes 256)
    TRAIN_LARGE=(--d-model 128 --layers 2 --heads 4 --batch 8 --length 64 --vocab 1000 --steps 2 --peak-sizes 256)
    LOOP=(--batch 16 --loop-steps 40 --log-every 10 --decode-lengths 16,32 --decode-batch 2 --repeats 1)
    NUMBERS_SHORT=(--config.train.num_steps=20 --config.train.batch_size=16 --config.train.log_every=5
                   --config.train.eval_every=20 --config.train.checkpoint_every=20 --config.train.max_eval_batches=1)
    PYTEST_ARGS=(tests/test_kernels_exact.py -k "option_errors or exactly_the_band or memory_is_a_fraction")
    FUSED=(--smoke)
    LIMITS=(120 90 90 180 120 180 120 180)
    ;;
  tiny)
    ATTN_ENV=()
    ATTN=(--lengths 128 --batch 1 --kernels dense,local --repeats 1 --time-budget 30)
    TRAIN_DEFAULT=(--d-model 32 --layers 1 --heads 2 --batch 4 --length 8 --vocab 50 --steps 2 --peak-sizes 128)
    TRAIN_LARGE=("${TRAIN_DEFAULT[@]}")
    LOOP=(--batch 8 --loop-steps 12 --log-every 4 --decode-lengths 8 --decode-batch 2 --repeats 1)
    NUMBERS_SHORT=(--config.train.num_steps=4 --config.train.batch_size=8 --config.train.log_every=2
                   --config.train.eval_every=4 --config.train.checkpoint_every=4 --config.train.max_eval_batches=1)
    PYTEST_ARGS=(--collect-only $TEST_FILES)
    FUSED=(--smoke)
    LIMITS=(60 60 60 120 60 120 60 120)
    ;;
esac
[ -n "${DEVICE_CHECK_PYTEST_ARGS:-}" ] && read -r -a PYTEST_ARGS <<< "$DEVICE_CHECK_PYTEST_ARGS"
[ -n "${DEVICE_CHECK_ATTENTION_ARGS:-}" ] && read -r -a MORE <<< "$DEVICE_CHECK_ATTENTION_ARGS" && ATTN+=("${MORE[@]}")

# --- steps -----------------------------------------------------------------------------------------------------
step environment 60 "$PY" -c "import json, sys; from attn_lab.environment import environment; \
json.dump(environment(), open(sys.argv[1], 'w'), indent=1); print(open(sys.argv[1]).read())" "$OUT/environment.json"
step attention "${LIMITS[0]}" "${ATTN_ENV[@]}" "$PY" scripts/bench_attention.py --dtype bfloat16 "${ATTN[@]}" --out "$OUT/bench_attention"
step train_default "${LIMITS[1]}" "$PY" scripts/bench_train.py --dtype bfloat16 "${TRAIN_DEFAULT[@]}" \
  --out "$OUT/bench_train_default"
step train_large "${LIMITS[2]}" "$PY" scripts/bench_train.py --dtype bfloat16 "${TRAIN_LARGE[@]}" \
  --out "$OUT/bench_train_large"
LOOP_HELP="$(cd "$ROOT" && "$PY" scripts/bench_train.py --help 2>/dev/null)"
if grep -qE -- "--loop([^-]|$)" <<< "$LOOP_HELP"; then
  grep -q -- "--loop-steps" <<< "$LOOP_HELP" || LOOP=()  # sizes only where the option exists
  step loop "${LIMITS[3]}" "$PY" scripts/bench_train.py --loop "${LOOP[@]}" --out "$OUT/bench_loop"
else
  skip loop "scripts/bench_train.py has no --loop option yet"
fi
step numbers_1seed "${LIMITS[4]}" "$PY" -m attn_lab.train "${NUMBERS[@]}" "${NUMBERS_SHORT[@]}" \
  --workdir "$OUT/numbers_1seed"
step numbers_8seeds "${LIMITS[5]}" "$PY" -m attn_lab.train "${NUMBERS[@]}" "${NUMBERS_SHORT[@]}" \
  --workdir "$OUT/numbers_8seeds/seed={seed}" --seeds 0,1,2,3,4,5,6,7
step fused "${LIMITS[7]}" "$PY" scripts/fused_check.py "${FUSED[@]}" --out "$OUT/fused.json"
step tests "${LIMITS[6]}" "$PY" -m pytest -q -p no:cacheprovider --junitxml="$OUT/tests.xml" "${PYTEST_ARGS[@]}"

"${REPORT[@]}" write "$OUT" > /dev/null
rc=$?
echo "wrote $OUT/device_check.md ($([ $rc -eq 0 ] && echo 'all steps ran' || echo 'some steps failed'))"
exit $rc
