#!/usr/bin/env bash
# Run 10: the graph-launched program's first run: its gpu tests, then a short validate on run 5's calibration
# (llama-3.1-8b q8_0, 8,192 and 65,536, depths 0 and 1) for the host time per split launch.
set -u -o pipefail
export PYTHONUNBUFFERED=1
R=$OUT/h200; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $R/gpu.txt
timeout 240 python3 -m pytest -q -x -p no:cacheprovider -m gpu tests/test_program_executors.py tests/test_cupy_backend.py 2>&1 | tail -40 | tee $R/pytest-gpu.txt
timeout 200 python3 -m sim.cli validate --hardware validate/results/h200/calibrated.json --model llama-3.1-8b --cache-type q8_0 \
  --context 8192,65536 --depth 0,1 --budget 0 --tokens 6 --warmup 2 --reps 2 --out $R/smoke 2>$R/smoke.err | tee $R/smoke.txt
tail -5 $R/smoke.err
python3 - $R/smoke/report.json <<'PY' 2>&1 | tee $R/smoke-launch.txt
import json, sys
d = json.load(open(sys.argv[1]))
for p in d["points"]:
    print({k: p.get(k) for k in ("context", "depth", "measured_tps", "predicted_tps", "host_split_launch_us", "host_split_launch_vs_calibration")})
PY
cd $OUT && tar czf h200.tgz h200 && rm -rf h200 && ls -la $OUT
