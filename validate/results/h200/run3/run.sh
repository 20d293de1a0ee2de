#!/usr/bin/env bash
# The H200 validation run, as sent through the device tool (one call, ~9 minutes):
#   run(command="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade
#        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:. || exit; bash validate/results/h200/run.sh",
#       carry=[".whl"])   # .whl/ holds the simpy wheel (the device has no simpy and no network)
# Every stage runs under a share of one deadline so the call ends inside the tool's 600 s.
# Output: $OUT/h200.tgz (everything below $OUT/h200), $OUT/trace.json.gz, $OUT/log.txt.
set -u -o pipefail
export PYTHONUNBUFFERED=1
R=$OUT/h200
mkdir -p $R
START=$(date +%s); DEADLINE=$((START + ${KVPIPE_RUN_S:-570}))
left() { echo $((DEADLINE - $(date +%s) - $1)); }   # seconds left, keeping $1 for what follows
M=llama-3.1-8b,qwen3.8-27b
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,clocks.sm,clocks.mem \
  --format=csv | tee $R/nvidia-smi.txt
# 1. calibrate: micro-measurements and the program's compute at windows that are not the validation grid's
timeout $(left 330) python3 -m sim.cli calibrate --model $M --cache-type q8_0 --reps 5 --rounds 2 --out $R/calibrated.json \
  2>$R/calibrate.err | tee $R/calibrate.txt
echo "calibrate rc=$? at $(( $(date +%s) - START )) s" | tee -a $R/calibrate.txt
# 2. validate: 2 models x 3 contexts x 4 depths x 2 budgets, A/B order, 3 repetitions, warm-up graph excluded
timeout $(left 90) python3 -m sim.cli validate --hardware $R/calibrated.json --model $M --cache-type q8_0 \
  --context 4096,16384,65536 --depth 0,1,2,4 --budget 0,128 --tokens 8 --warmup 1 --reps 3 \
  --out $R/report --trace $OUT/trace.json 2>$R/validate.err | tee $R/validate.txt
echo "validate rc=$? at $(( $(date +%s) - START )) s" | tee -a $R/validate.txt
# 3. the gate can fail: a slot recycled one split early (margin0 + issue-before-enqueue), a recycle with no
#    release wait (margin0 + no-release-wait), staging in allocator memory
for MU in margin0,issue-before-enqueue margin0,no-release-wait allocator-staging; do
  timeout $(left 25) python3 -m sim.cli validate --hardware $R/calibrated.json --model llama-3.1-8b --cache-type q8_0 \
    --context 16384 --depth 0,1 --budget 0 --tokens 4 --warmup 1 --reps 1 --mutate $MU \
    --out $R/mutate-${MU//,/+} 2>>$R/mutate.err | tee -a $R/mutate.txt
  echo "mutate $MU rc=$? at $(( $(date +%s) - START )) s" | tee -a $R/mutate.txt
done
# 4. the gpu-marked tests, with what is left
timeout $(left 12) python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cupy_backend.py 2>&1 | tail -15 | tee $R/pytest-gpu.txt
for f in $R/calibrate.err $R/validate.err $R/mutate.err; do tail -n 3 $f; done
head -60 $R/report/report.md
gzip -f $OUT/trace.json 2>/dev/null
cd $OUT && tar czf h200.tgz h200 && rm -rf h200 && ls -la $OUT
