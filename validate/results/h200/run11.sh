#!/usr/bin/env bash
# Run 11: the graph-launched program calibrated: gpu tests, `kvpipe calibrate` of both models at f16, q8_0 and q4_0
# (windows 2,048 / 12,288 / 32,768 / 98,304: the calibration points), then the timing-race gate switches
# (no-release-wait and margin0,no-release-wait; 3 repetitions each) on llama-3.1-8b q8_0 8,192, a context no
# calibration ran.
set -u -o pipefail
export PYTHONUNBUFFERED=1
R=$OUT/h200; mkdir -p $R
START=$(date +%s); DEADLINE=$((START + ${KVPIPE_RUN_S:-560}))
left() { echo $((DEADLINE - $(date +%s) - $1)); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee $R/gpu.txt
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_program_executors.py tests/test_cupy_backend.py 2>&1 | tail -5 | tee $R/pytest-gpu.txt
timeout $(left 150) python3 -m sim.cli calibrate --model llama-3.1-8b,qwen3.8-27b --cache-type f16,q8_0,q4_0 --reps 5 --rounds 2 \
  --out $R/calibrated.json 2>$R/calibrate.err | tee $R/calibrate.txt
echo "calibrate rc=$? at $(( $(date +%s) - START )) s" | tee -a $R/calibrate.txt
for MU in no-release-wait margin0,no-release-wait; do
  timeout $(left 5) python3 -m sim.cli validate --hardware $R/calibrated.json --model llama-3.1-8b --cache-type q8_0 \
    --context 8192 --depth 0,1,2 --budget 0 --tokens 6 --warmup 2 --reps 3 --mutate $MU --no-reference-arms \
    --out $R/mutate-${MU//,/+} 2>>$R/mutate.err | tee -a $R/mutate.txt
  echo "mutate $MU rc=$? at $(( $(date +%s) - START )) s" | tee -a $R/mutate.txt
done
tail -3 $R/calibrate.err $R/mutate.err
cd $OUT && tar czf h200.tgz h200 && rm -rf h200 && ls -la $OUT
