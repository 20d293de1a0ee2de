#!/usr/bin/env bash
# Run 6: why the f16 pipelined points of run 4 ran ~20% under the prediction where copy ~ compute.
# (1) kernels alone and under a concurrent 4 GiB H2D copy (contention.py); (2) the f16 32,768 point again,
# ordered and depth 1, with the GPU timeline (CUDA event spans) to hold beside the simulated one.
set -u -o pipefail
export PYTHONUNBUFFERED=1
R=$OUT/h200; mkdir -p $R
timeout 60 python3 validate/results/h200/contention.py > $R/contention.json 2>$R/contention.err; cat $R/contention.json
timeout 300 python3 -m sim.cli validate --hardware validate/results/h200/run4/calibrated.json --model llama-3.1-8b --cache-type f16 \
  --context 32768 --depth 0,1 --budget 0 --tokens 4 --warmup 1 --reps 2 \
  --out $R/report-f16-trace --trace $OUT/trace-f16.json 2>$R/validate.err | tee $R/validate.txt
gzip -f $OUT/trace-f16.json
cd $OUT && tar czf h200.tgz h200 && rm -rf h200 && ls -la $OUT
