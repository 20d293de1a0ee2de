#!/usr/bin/env bash
# The H200 validation run, as sent through the device tool (one call, ~9 minutes):
#   run(command="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade
#        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:. || exit; bash validate/results/h200/run.sh",
#       carry=[".whl"])   # .whl/ holds the simpy wheel (the device has no simpy and no network)
# Every stage runs under a share of one deadline so the call ends inside the tool's 600 s.
# Output: $OUT/h200.tgz (everything below $OUT/h200), $OUT/trace.json.gz.
# Run 4 (this script): calibration of q8_0 and f16 programs; the grid's groups of one model take turns
# (repetition 1 of every context, then repetition 2, ...), 5 repetitions, a host probe before each;
# f16 points for llama where copy ~ compute; the gpu tests.
set -u -o pipefail
export PYTHONUNBUFFERED=1
R=$OUT/h200
mkdir -p $R
START=$(date +%s); DEADLINE=$((START + ${KVPIPE_RUN_S:-570}))
left() { echo $((DEADLINE - $(date +%s) - $1)); }   # seconds left, keeping $1 for what follows
M=llama-3.1-8b,qwen3.8-27b
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,clocks.sm,clocks.mem \
  --format=csv | tee $R/nvidia-smi.txt
(nproc; grep -m1 'model name' /proc/cpuinfo; nvidia-smi topo -m) >$R/host.txt 2>&1
# 1. calibrate: micro-measurements and the program's compute at windows that are not the validation grid's
timeout $(left 420) python3 -m sim.cli calibrate --model $M --cache-type q8_0,f16 --reps 5 --rounds 2 --out $R/calibrated.json \
  2>$R/calibrate.err | tee $R/calibrate.txt
echo "calibrate rc=$? at $(( $(date +%s) - START )) s" | tee -a $R/calibrate.txt
# 2. validate: 2 models x 3 contexts x 4 depths x 2 budgets, A/B order, contexts taking turns, 5 repetitions
timeout $(left 125) python3 -m sim.cli validate --hardware $R/calibrated.json --model $M --cache-type q8_0 \
  --context 4096,16384,65536 --depth 0,1,2,4 --budget 0,128 --tokens 8 --warmup 1 --reps 5 \
  --out $R/report --trace $OUT/trace.json 2>$R/validate.err | tee $R/validate.txt
echo "validate rc=$? at $(( $(date +%s) - START )) s" | tee -a $R/validate.txt
# 3. where copy ~ compute: the f16 cache moves 1.9x the q8_0 bytes per row for a cheaper decode
timeout $(left 12) python3 -m sim.cli validate --hardware $R/calibrated.json --model llama-3.1-8b --cache-type f16 \
  --context 32768,65536 --depth 0,1,2 --budget 0 --tokens 6 --warmup 1 --reps 3 \
  --out $R/report-f16 2>$R/validate-f16.err | tee $R/validate-f16.txt
echo "validate f16 rc=$? at $(( $(date +%s) - START )) s" | tee -a $R/validate-f16.txt
# 4. the gpu-marked tests, with what is left
timeout $(left 2) python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cupy_backend.py 2>&1 | tail -15 | tee $R/pytest-gpu.txt
for f in $R/calibrate.err $R/validate.err $R/validate-f16.err; do tail -n 3 $f; done
head -40 $R/report/report.md
gzip -f $OUT/trace.json 2>/dev/null
cd $OUT && tar czf h200.tgz h200 && rm -rf h200 && ls -la $OUT
