#!/usr/bin/env bash
# Run 7: the split-launch model held to new measurements (predicted before they were made): calibrate llama-3.1-8b's
# q8_0 and f16 programs with the current calibrate (it measures split_launch_us and fits the glue with it), then
# validate f16 at 32,768 / 65,536 (copy ~ compute) and q8_0 at 4,096 / 16,384.
set -u -o pipefail
export PYTHONUNBUFFERED=1
R=$OUT/h200; mkdir -p $R
START=$(date +%s); DEADLINE=$((START + ${KVPIPE_RUN_S:-380}))
left() { echo $((DEADLINE - $(date +%s) - $1)); }
timeout $(left 250) python3 -m sim.cli calibrate --model llama-3.1-8b --cache-type q8_0,f16 --reps 5 --rounds 2 \
  --out $R/calibrated.json 2>$R/calibrate.err | tee $R/calibrate.txt
echo "calibrate rc=$? at $(( $(date +%s) - START )) s" | tee -a $R/calibrate.txt
timeout $(left 80) python3 -m sim.cli validate --hardware $R/calibrated.json --model llama-3.1-8b --cache-type f16 \
  --context 32768,65536 --depth 0,1,2 --budget 0 --tokens 6 --warmup 1 --reps 3 \
  --out $R/report-f16 2>$R/validate-f16.err | tee $R/validate-f16.txt
echo "validate f16 rc=$? at $(( $(date +%s) - START )) s" | tee -a $R/validate-f16.txt
timeout $(left 3) python3 -m sim.cli validate --hardware $R/calibrated.json --model llama-3.1-8b --cache-type q8_0 \
  --context 4096,16384 --depth 0,1,2 --budget 0 --tokens 8 --warmup 1 --reps 5 \
  --out $R/report-q8 2>$R/validate-q8.err | tee $R/validate-q8.txt
echo "validate q8_0 rc=$? at $(( $(date +%s) - START )) s" | tee -a $R/validate-q8.txt
cd $OUT && tar czf h200.tgz h200 && rm -rf h200 && ls -la $OUT
