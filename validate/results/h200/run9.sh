#!/usr/bin/env bash
# Run 9: the final code on the GPU: the gpu-marked tests, and the gate switches again (llama-3.1-8b q8_0 16,384,
# depths 0 and 1, run 5's calibration).
set -u -o pipefail
export PYTHONUNBUFFERED=1
R=$OUT/h200; mkdir -p $R
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cupy_backend.py 2>&1 | tail -5 | tee $R/pytest-gpu.txt
for MU in margin0,issue-before-enqueue allocator-staging no-release-wait; do
  timeout 40 python3 -m sim.cli validate --hardware validate/results/h200/calibrated.json --model llama-3.1-8b --cache-type q8_0 \
    --context 16384 --depth 0,1 --budget 0 --tokens 4 --warmup 1 --reps 1 --mutate $MU \
    --out $R/mutate-${MU//,/+} 2>>$R/mutate.err | tee -a $R/mutate.txt
  echo "mutate $MU rc=$?" | tee -a $R/mutate.txt
done
cd $OUT && tar czf h200.tgz h200 && rm -rf h200 && ls -la $OUT
