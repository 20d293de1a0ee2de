#!/usr/bin/env bash
# Issue 24 item 2, run 2: the same command as run.sh on a fresh lease (a second measurement of the same grid, nothing refitted). Sent through the device tool as
#   run(command="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade
#        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:. || exit; bash validate/results/h200-kvgpu/run2.sh",
#       carry=[".whl"])   # .whl: the simpy wheel (the device has no simpy, no network)
# 1. the gpu tests of the program's executors (the resident-layer CUDA graphs against the NumPy reference);
# 2. kvpipe validate: llama-3.1-8b q8_0, --kv-gpu-layers 0,8,16 x depths 0,1,2 at contexts 8,192 and 49,152 (run 11's
#    calibration ran windows 2,048 / 12,288 / 32,768 / 98,304: none of these), predicted from run 11's calibration.
set -u -o pipefail
export PYTHONUNBUFFERED=1
R=$OUT/h200-kvgpu-run2; mkdir -p $R
CAL=validate/results/h200/run11/calibrated.json
START=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv | tee $R/nvidia-smi.txt
timeout 80 python3 -m pytest -q -p no:cacheprovider -m gpu tests/sim/test_program_executors.py 2>&1 | tail -4 | tee $R/pytest-gpu.txt
echo "pytest at $(( $(date +%s) - START )) s" | tee -a $R/pytest-gpu.txt
timeout $((300 - $(date +%s) + START)) nice -n -10 taskset -c 5 python3 -m kvpipe.cli validate --hardware $CAL \
  --model llama-3.1-8b --cache-type q8_0 --context 8192,49152 --kv-gpu-layers 0,8,16 --depth 0,1,2 --budget 0 \
  --tokens 8 --warmup 2 --reps 3 --out $R/report 2>$R/validate.err | tee $R/validate.txt
echo "validate rc=$? at $(( $(date +%s) - START )) s" | tee -a $R/validate.txt
tail -n 3 $R/validate.err
cd $OUT && tar czf h200-kvgpu-run2.tgz h200-kvgpu-run2 && ls -la $OUT
