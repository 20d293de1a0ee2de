#!/usr/bin/env bash
# After-the-fact study (issue 28, docs/validation.md "Run 13"): runs 11-13's batched fit and held-out comparison with
# the pageable staging curve other than the base profile's two regimes (run 8's llama-bench knee between 1.33 and 1.50
# MiB a copy): CURVE flat (one rate at every copy size, the staging factor fitted as each run's design fitted it) or
# sizes (`--fit-staging sizes`: one rate per copy size of the one-sequence calibration rows). Design evidence only:
# every held-out row of these runs had been read before this study was written. Needs the GGUF of
# prediction-batched12/README.md.
#   bash tools/llamacpp/staging_curve_study.sh RUN CURVE OUT   (RUN: 11, 12 or 13; CURVE: flat or sizes; OUT: a scratch folder)
set -euo pipefail
if [ $# -ne 3 ]; then echo "staging_curve_study: $# arguments; allowed: RUN CURVE OUT (e.g. 13 sizes /tmp/study)" >&2; exit 2; fi
run=$1; curve=$2; out=$3
R=validate/results/h200-llamacpp
G=${GGUF:-/tmp/llama-3.1-8b-q8_0.gguf}
case $run in 11|12|13) ;; *) echo "staging_curve_study: RUN $run; allowed: 11, 12 or 13" >&2; exit 2 ;; esac
case $curve in flat) fit=one ;; sizes) fit=sizes ;; *) echo "staging_curve_study: CURVE $curve; allowed: flat or sizes" >&2; exit 2 ;; esac
[ -f "$G" ] || { echo "staging_curve_study: GGUF $G is not a file; allowed: the GGUF of prediction-batched12/README.md (or GGUF=path)" >&2; exit 2; }
mkdir -p "$out"
python - "$out/base.json" "$curve" <<'PY'
import json, sys
d = json.load(open("validate/results/h200-llamacpp/prediction-types8/profile.json"))
if sys.argv[2] == "flat":  # one rate; the fitted staging factor sets it
    for dev in d["devices"]:
        dev["links"]["h2d_pageable"]["points"] = [[1.0, 8.85]]
json.dump(d, open(sys.argv[1], "w"), indent=1)
PY
ctx=()
case $run in
  11) files=$(for c in split unified; do for pp in 512 1280; do ls $R/run11/call*/r11-batched-$c-pp$pp-r[1-5].jsonl; done; done)
      held=576,1120; ctx=(--ctx 576=14336); rule=(); cmp=(--statistic gmean); measured=$(ls $R/run11/call*/r11-batched-*.jsonl) ;;
  12) files=$(for c in split unified; do for pp in 512 1280; do ls $R/run12/call*/r12-batched-$c-pp$pp-r[1-8].jsonl; done; done)
      held=800,1000; rule=(); cmp=(--statistic gmean); measured=$(ls $R/run12/call*/r12-batched-*.jsonl) ;;
  13) files=$(for c in split unified; do for pp in 512 1280; do ls $R/run13/call[12]/r13-batched-$c-pp$pp-r[1-6].jsonl $R/run13/call3/r13-batched-$c-pp$pp-r1.jsonl; done; done)
      held=672,1056; rule=(--drop-outliers 0.25); cmp=(--statistic gmean --drop-outliers 0.25 --machines call1=A,call2=A,call3=B)
      measured=$(ls $R/run13/call*/r13-batched-*.jsonl | grep -v 'call3/r13-batched-unified-pp1280-r2') ;;
  *) echo "staging_curve_study: RUN $run; allowed: 11, 12 or 13" >&2; exit 2 ;;
esac
n=$(echo "$files" | wc -l)
units=$(for i in $(seq 1 "$n"); do if [ "$i" -le $((n / 2)) ]; then echo 0; else echo 1; fi; done | paste -sd,)
kvpipe calibrate --from-batched-bench "$(echo "$files" | paste -sd,)" --kv-unified "$units" --nkvo 1 --pageable \
    --fit-staging $fit --kv-copy span "${rule[@]}" --hardware "$out/base.json" -m "$G" --out "$out/profile.json" > "$out/calibrate.txt"
python tools/llamacpp/predict_batched.py predict --profile "$out/profile.json" --gguf "$G" --pp $held --tg 64 \
    "${ctx[@]}" --kv-copy span --out "$out" > "$out/predict.txt"
python tools/llamacpp/predict_batched.py compare --out "$out" "${cmp[@]}" $measured | tail -9
