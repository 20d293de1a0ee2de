#!/usr/bin/env bash
# Issue 27, run 1: the reference schedule against the best (--kv-schedule reference,fresh+inputs-first+across-tokens)
# on the H200, predicted before measured from a calibration made in the same call. Sent through the device tool as
#   run(command="cd .sched && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target
#        /tmp/site ../.whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; bash validate/results/h200-schedules/run1.sh",
#       carry=[".sched", ".whl"])   # .sched: this branch's tree (git archive HEAD); .whl: the simpy wheel
# 0. a smoke run of the best schedule (exactness against depth 0; stops the call early if it fails);
# 1. kvpipe calibrate qwen3.8-27b at f16 and q8_0 (windows 2,048 / 12,288 / 32,768 / 98,304: the calibration points);
# 2. kvpipe validate at contexts none of them ran: f16 8,192 / 24,576 (copy ~ compute) and 49,152 (copy-bound); q8_0
#    4,096 (compute-bound), 16,384 / 24,576 (copy ~ compute); depths 0, 1, 2, both schedules, the resident and
#    copy-only arms beside them (the measured ceiling), 5 repetitions, traced;
# 3. the timing-race gate: margin0,no-release-wait under both schedules (3 repetitions), which must fail exactness;
# 4. llama-3.1-8b q8_0 (32 attention layers): calibrated, then 8,192 (copy ~ compute) and 65,536 (copy-bound).
# Warm-up 4 graphs: across tokens the slots go on round (16 deliveries a token over 3 slots at depth 1), so each
# split meets each slot address once in the first 3 graphs, and its CUDA graph is captured there, not in a timed one.
set -u -o pipefail
export PYTHONUNBUFFERED=1
R=$OUT/h200-schedules; mkdir -p $R
START=$(date +%s); DEADLINE=$((START + ${KVPIPE_RUN_S:-400}))
left() { echo $((DEADLINE - $(date +%s) - $1)); }
at() { echo "$1 rc=$2 at $(( $(date +%s) - START )) s" | tee -a $R/steps.txt; }
BEST=fresh+inputs-first+across-tokens
KV="nice -n -10 taskset -c 5 python3 -m kvpipe.cli"
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,clocks.sm,clocks.mem --format=csv | tee $R/gpu.txt
timeout 60 $KV validate --hardware h200-gen5x16-kvpipe --model qwen3.8-27b --cache-type q8_0 --context 4096 --depth 0,1 \
  --budget 0 --kv-schedule $BEST --tokens 3 --warmup 1 --reps 1 --no-reference-arms --out $R/smoke 2>$R/smoke.err | tee $R/smoke.txt
rc=$?; at smoke $rc
if [ $rc -ne 0 ]; then tail -n 20 $R/smoke.err; cd $OUT && tar czf h200-schedules.tgz h200-schedules; exit 1; fi
timeout 100 $KV calibrate --model qwen3.8-27b --cache-type f16,q8_0 --reps 5 --rounds 2 --out $R/calibrated.json \
  2>$R/calibrate.err | tee $R/calibrate.txt
at calibrate $?
run() {  # model cache contexts reps calibration keep-seconds
  timeout $(left $6) $KV validate --hardware $5 --model $1 --cache-type $2 --context $3 --depth 0,1,2 --budget 0 \
    --kv-schedule reference,$BEST --tokens 8 --warmup 4 --reps $4 --trace $R/trace-$1-$2.json --out $R/$1-$2 \
    2>>$R/validate.err | tee -a $R/validate.txt
  at "validate $1 $2 $3" $?
}
run qwen3.8-27b f16 8192,24576,49152 5 $R/calibrated.json 190
run qwen3.8-27b q8_0 4096,16384,24576 5 $R/calibrated.json 125
timeout $(left 105) $KV validate --hardware $R/calibrated.json --model qwen3.8-27b --cache-type q8_0 --context 16384 \
  --depth 0,1,2 --budget 0 --kv-schedule reference,$BEST --tokens 6 --warmup 4 --reps 3 --mutate margin0,no-release-wait \
  --no-reference-arms --out $R/mutate 2>$R/mutate.err | tee $R/mutate.txt
at mutate $?
timeout $(left 65) $KV calibrate --model llama-3.1-8b --cache-type q8_0 --reps 5 --rounds 2 --out $R/calibrated-llama.json \
  2>$R/calibrate-llama.err | tee $R/calibrate-llama.txt
at calibrate-llama $?
run llama-3.1-8b q8_0 8192,65536 3 $R/calibrated-llama.json 5
python3 -m validate.report --merge $R/report $R/qwen3.8-27b-*/report.json $R/llama-3.1-8b-*/report.json | tee -a $R/validate.txt
tail -n 3 $R/calibrate.err $R/validate.err $R/mutate.err $R/calibrate-llama.err
cd $OUT && tar czf h200-schedules.tgz h200-schedules && rm -rf h200-schedules && ls -la $OUT
