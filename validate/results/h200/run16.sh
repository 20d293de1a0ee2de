#!/usr/bin/env bash
# Run 16 (issue 25): the Machine hooks and the checker-as-a-Machine on the real GPU. After the move of point running
# into sim/run/ and of streams, events and free behind Machine's hooks, the CuPy backend is run again:
# 1. the gpu-marked tests (backend conformance on CuPy, the CUDA executor against NumPy, the CuPy backend);
# 2. one validate group, llama-3.1-8b q8_0 at 16,384 (copy ~ compute), depths 0/1/2, both the reference schedule and
#    the best one, 3 repetitions, run 11's calibration: exactness across depths and schedules, measured vs predicted
#    (a regression check against runs 12 and issue 27's runs, not a held-out claim);
# 3. the timing-race gate (margin0,no-release-wait), which must fail exactness.
# Sent as
#   run(command="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site
#        .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; bash validate/results/h200/run16.sh", carry=[".whl"])
set -u -o pipefail
export PYTHONUNBUFFERED=1
R=$OUT/h200-run16; mkdir -p $R
START=$(date +%s); DEADLINE=$((START + ${KVPIPE_RUN_S:-240}))
left() { echo $((DEADLINE - $(date +%s) - $1)); }
at() { echo "$1 rc=$2 at $(( $(date +%s) - START )) s" | tee -a $R/steps.txt; }
CAL=validate/results/h200/run11/calibrated.json
KV="nice -n -10 taskset -c 5 python3 -m kvpipe.cli"
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv | tee $R/gpu.txt
timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/backends/test_cupy_backend.py \
  tests/backends/test_backend_conformance.py tests/sim/test_program_executors.py 2>&1 | tail -15 | tee $R/pytest-gpu.txt
at pytest-gpu ${PIPESTATUS[0]}
timeout $(left 40) $KV validate --hardware $CAL --model llama-3.1-8b --cache-type q8_0 --context 16384 --depth 0,1,2 \
  --budget 0 --kv-schedule reference,fresh+inputs-first+across-tokens --tokens 8 --warmup 4 --reps 3 \
  --out $R/llama-3.1-8b-q8_0 2>$R/validate.err | tee $R/validate.txt
at validate ${PIPESTATUS[0]}
timeout $(left 2) $KV validate --hardware $CAL --model llama-3.1-8b --cache-type q8_0 --context 16384 --depth 0,1 \
  --budget 0 --tokens 4 --warmup 1 --reps 1 --no-reference-arms --mutate margin0,no-release-wait \
  --out $R/mutate-margin0+no-release-wait 2>$R/mutate.err | tee $R/mutate.txt
at mutate ${PIPESTATUS[0]}
tail -3 $R/validate.err $R/mutate.err
cd $OUT && tar czf h200-run16.tgz h200-run16 && rm -rf h200-run16 && ls -la $OUT
