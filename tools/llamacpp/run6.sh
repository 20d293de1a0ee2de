# The run 6 campaign of issues 30 and 28 (the design and its reasons: tools/llamacpp/README-run6.md), sourced by
# h200_bench.sh after the build for the phases run6 (the fitting machine: per cache type one llama-bench process per
# arm whose depths interleave calibration and held-out ones, then llama-batched-bench as time allows), run6b (the same
# machine, warm: what run6 left, then llama-batched-bench, calibration and held-out -npp values interleaved, each
# configuration 3 times) and run6f (a fresh machine: the held-out depths again, nothing of them fitted).
# One process per (type, arm) runs its depths in the order given; split_roles then writes the calibration rows and the
# held-out rows to separate files on the device (NAME-cal.json, NAME-held.json; the process's own file is NAME-all.json)
# and only the calibration figures reach the summary.
REPS=${LCP_REPS:-5}
LCP_TG=${LCP_TG:-64}                     # llama-batched-bench -ntg (run 5: 32)
# name K V "ordered depths, in run order" "their calibration depths" "resident depths" "their calibration depths"
R6_TYPES=("f16 f16 f16 640,1152,3072,2304 640,3072 12800,8192,28672 8192"
          "q8_0 q8_0 q8_0 1024,1664,5120,3840 1024,5120 1024,12800,16384,28672 1024,16384"
          "q4_0 q4_0 q4_0 2048,4608,10240,7680 2048,10240 12800,8192,28672 8192"
          "mixed q8_0 q4_0 1024,2816,5120,4480 1024,5120 12800,8192,28672 8192")

# Split a finished process's rows by depth into NAME-cal.json (depths in $2) and NAME-held.json (the rest), printing
# the calibration rows only (the held-out figures stay unread until the blind predictions are committed).
split_roles() {
  local name=$1 cal=$2
  [ -f "$RUN/$name-all.json" ] || return 0
  python3 - "$RUN/$name-all.json" "$cal" "$RUN/$name-cal.json" "$RUN/$name-held.json" <<'PY' | tee -a "$RUN/summary.txt"
import json, sys
t = open(sys.argv[1]).read().rstrip().rstrip(",")
try:
    rows = json.loads(t if t.endswith("]") else t + "]")
except ValueError:
    rows = []
cal = {int(d) for d in sys.argv[2].split(",")}
mine = [r for r in rows if r["n_depth"] in cal]
json.dump(mine, open(sys.argv[3], "w"), indent=1)
json.dump([r for r in rows if r["n_depth"] not in cal], open(sys.argv[4], "w"), indent=1)
print(f"  {sys.argv[1].rsplit('/', 1)[-1]}: {len(mine)} calibration rows, {len(rows) - len(mine)} held out; calibration: "
      + "; ".join(f"{r['type_k']}/{r['type_v']} nkvo={int(r['no_kv_offload'])} d={r['n_depth']}: "
                  f"{sorted(r['samples_ts'])[len(r['samples_ts']) // 2]:.2f} t/s (median)" for r in mine))
PY
}

types_grid() {  # per cache type: the ordered process, then the resident one; each interleaves its roles by depth
  local row n k v od oc rd rc
  for row in "${R6_TYPES[@]}"; do
    read -r n k v od oc rd rc <<< "$row"
    HIDE=1 bench r6-ord-$n-all -ctk $k -ctv $v -nkvo 1 -d "$od" && split_roles r6-ord-$n "$oc"
    HIDE=1 bench r6-res-$n-all -ctk $k -ctv $v -nkvo 0 -d "$rd" && split_roles r6-res-$n "$rc"
  done
}

types_held() {  # the fresh machine: the held-out depths alone, one process per (type, arm)
  local row n k v od oc rd rc
  for row in "${R6_TYPES[@]}"; do
    read -r n k v od oc rd rc <<< "$row"
    HIDE=1 bench r6f-ord-$n-held -ctk $k -ctv $v -nkvo 1 -d "$(held_of "$od" "$oc")"
    HIDE=1 bench r6f-res-$n-held -ctk $k -ctv $v -nkvo 0 -d "$(held_of "$rd" "$rc")"
  done
}

held_of() {  # the depths of list $1 not in list $2, comma-separated
  python3 -c "import sys; c = set(sys.argv[2].split(',')); print(','.join(d for d in sys.argv[1].split(',') if d not in c))" "$1" "$2"
}

batched_grid() {  # h200_bench.sh's batched_rounds: 3 rounds, the held-out -npp between calibration ones
  batched_rounds r6 "${LCP_R6_PP:-512 896 1280}" "${LCP_R6_PP_HELD:-896}"
}

case $PHASE in
  run6|run6b)
    types_grid
    batched_grid
    ;;
  run6f)
    types_held
    ;;
esac
exit 0
