# The run 7 campaign of issues 30 and 28 (the design and its reasons: tools/llamacpp/README-run7.md), sourced by
# h200_bench.sh after the build for the phases run7 (the fitting machine: every ordered configuration in its own
# llama-bench process, calibration and held-out processes alternating in time, each type's resident process after
# its ordered ones; then llama-batched-bench as time allows), run7b (the same machine, warm: what run7 left, then
# llama-batched-bench, calibration and held-out -npp values interleaved in each of 3 rounds) and run7f (a fresh
# machine: the held-out configurations again, one process each as on the fitting machine, nothing of them fitted).
# Held-out processes run with HIDE (their figures stay out of the summary); a resident process interleaves its roles by
# depth and split_roles (run6.sh's, read from there unchanged) writes NAME-cal.json and NAME-held.json on the device.
REPS=${LCP_REPS:-5}
LCP_TG=${LCP_TG:-64}                     # llama-batched-bench -ntg (run 6's)
eval "$(sed -n '/^split_roles() {/,/^}/p' "$ROOT/tools/llamacpp/run6.sh")"
# Ordered (-nkvo 1): "name K V depth role", one llama-bench process each, in run order (cal and held alternate).
R7_ORD=("f16 f16 f16 640 cal" "f16 f16 f16 1408 held" "f16 f16 f16 3072 cal" "f16 f16 f16 2688 held"
        "q8_0 q8_0 q8_0 1024 cal" "q8_0 q8_0 q8_0 2432 held" "q8_0 q8_0 q8_0 5120 cal" "q8_0 q8_0 q8_0 4352 held"
        "q4_0 q4_0 q4_0 2048 cal" "q4_0 q4_0 q4_0 5888 held" "q4_0 q4_0 q4_0 10240 cal" "q4_0 q4_0 q4_0 8960 held"
        "mixed q8_0 q4_0 1024 cal" "mixed q8_0 q4_0 2176 held" "mixed q8_0 q4_0 5120 cal" "mixed q8_0 q4_0 3328 held")
# Resident (-nkvo 0), as run 6: "name K V depths-in-run-order calibration-depths", one process per type.
R7_RES=("f16 f16 f16 7168,8192,22528 8192"
        "q8_0 q8_0 q8_0 1024,7168,16384,22528 1024,16384"
        "q4_0 q4_0 q4_0 7168,8192,22528 8192"
        "mixed q8_0 q4_0 7168,8192,22528 8192")

held_of() {  # the depths of list $1 not in list $2, comma-separated
  python3 -c "import sys; c = set(sys.argv[2].split(',')); print(','.join(d for d in sys.argv[1].split(',') if d not in c))" "$1" "$2"
}

types_grid() {  # per type: its 4 ordered processes (cal, held, cal, held), then its resident process
  local row n k v d role rd rc
  for row in "${R7_RES[@]}"; do
    read -r n k v rd rc <<< "$row"
    for o in "${R7_ORD[@]}"; do
      read -r on k v d role <<< "$o"
      [ "$on" = "$n" ] || continue
      if [ $role = held ]; then HIDE=1 bench r7-ord-$n-d$d-held -ctk $k -ctv $v -nkvo 1 -d $d
      else bench r7-ord-$n-d$d-cal -ctk $k -ctv $v -nkvo 1 -d $d; fi
    done
    read -r n k v rd rc <<< "$row"
    HIDE=1 bench r7-res-$n-all -ctk $k -ctv $v -nkvo 0 -d "$rd" && split_roles r7-res-$n "$rc"
  done
}

types_fresh() {  # the fresh machine: the held-out configurations alone; every ordered one first (one process each, as
  local row n k v d role rd rc  # above: what varies between machines), then the resident ones (one process per type)
  for o in "${R7_ORD[@]}"; do
    read -r n k v d role <<< "$o"
    [ $role = held ] && HIDE=1 bench r7f-ord-$n-d$d-held -ctk $k -ctv $v -nkvo 1 -d $d
  done
  for row in "${R7_RES[@]}"; do
    read -r n k v rd rc <<< "$row"
    HIDE=1 bench r7f-res-$n-held -ctk $k -ctv $v -nkvo 0 -d "$(held_of "$rd" "$rc")"
  done
}

batched_grid() {  # h200_bench.sh's batched_rounds: 3 rounds, every held-out -npp between the two calibration ones
  batched_rounds r7 "${LCP_R7_PP:-512 768 1152 1280}" "${LCP_R7_PP_HELD:-768 1152}"
}

case $PHASE in
  run7|run7b)
    types_grid
    batched_grid
    ;;
  run7f)
    types_fresh
    ;;
esac
exit 0
