#!/usr/bin/env bash
# Run 8: as run 7, for the hybrid model: calibrate qwen3.8-27b q8_0 with the current calibrate, then validate
# 4,096 / 16,384 / 65,536 at depths 0, 1, 2 (predicted before measured).
set -u -o pipefail
export PYTHONUNBUFFERED=1
R=$OUT/h200; mkdir -p $R
START=$(date +%s); DEADLINE=$((START + ${KVPIPE_RUN_S:-240}))
left() { echo $((DEADLINE - $(date +%s) - $1)); }
timeout $(left 200) python3 -m sim.cli calibrate --model qwen3.8-27b --cache-type q8_0 --reps 5 --rounds 2 \
  --out $R/calibrated.json 2>$R/calibrate.err | tee $R/calibrate.txt
echo "calibrate rc=$? at $(( $(date +%s) - START )) s" | tee -a $R/calibrate.txt
timeout $(left 3) python3 -m sim.cli validate --hardware $R/calibrated.json --model qwen3.8-27b --cache-type q8_0 \
  --context 4096,16384,65536 --depth 0,1,2 --budget 0 --tokens 8 --warmup 1 --reps 3 \
  --out $R/report 2>$R/validate.err | tee $R/validate.txt
echo "validate rc=$? at $(( $(date +%s) - START )) s" | tee -a $R/validate.txt
cd $OUT && tar czf h200.tgz h200 && rm -rf h200 && ls -la $OUT
