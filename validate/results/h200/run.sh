#!/usr/bin/env bash
# The H200 validation run, as sent through the device tool (one call).
# Output lands in $OUT/h200 and comes back as h200.tgz (+ logs).
set -u -o pipefail
export PYTHONUNBUFFERED=1
R=$OUT/h200
mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,clocks.sm,clocks.mem --format=csv | tee $R/nvidia-smi.txt
python3 -m pytest -q -m gpu tests/test_cupy_backend.py 2>&1 | tail -25 | tee $R/pytest-gpu.txt
python3 -m sim.cli calibrate --model llama-3.1-8b,qwen3.8-27b --cache-type q8_0 --windows 1024,8192,32768 \
  --reps 5 --out $R/calibrated.json 2>$R/calibrate.err | tee $R/calibrate.txt
python3 -m sim.cli validate --hardware $R/calibrated.json --model llama-3.1-8b,qwen3.8-27b --cache-type q8_0 \
  --context 4096,16384,65536 --depth 0,1,2,4 --budget 0,128 --tokens 8 --warmup 1 --reps 5 \
  --out $R/report --trace $R/report/trace.json 2>$R/validate.err | tee $R/validate.txt
echo "validate rc=$?" | tee -a $R/validate.txt
for M in margin0,issue-before-enqueue margin0,no-release-wait allocator-staging; do
  python3 -m sim.cli validate --hardware $R/calibrated.json --model llama-3.1-8b,qwen3.8-27b --cache-type q8_0 \
    --context 4096,65536 --depth 0,1,2,4 --budget 0 --tokens 4 --warmup 1 --reps 1 --mutate $M \
    --out $R/mutate-${M//,/+} 2>>$R/mutate.err | tee -a $R/mutate.txt
  echo "mutate $M rc=$?" | tee -a $R/mutate.txt
done
tail -5 $R/calibrate.err $R/validate.err $R/mutate.err
cd $OUT && tar czf h200.tgz h200 && ls -la $OUT
cat $R/report/report.md | head -70
