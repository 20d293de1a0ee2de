# The run 8 campaign of issues 30 and 28 (the design, its rules and their reasons: tools/llamacpp/README-run8.md),
# sourced by h200_bench.sh after the build for the phases run8, run8b and run8c (one machine: run8 builds and starts,
# run8b and run8c, warm, go on where the last call stopped; finished processes are not repeated).
# Issue 30: the cache types INTERLEAVED in time. Round A runs the 16 ordered configurations (R8_ORD) slot by slot and,
# inside a slot, type by type; then one resident process per type (as run 7); round B runs round A's 16 in reverse
# order, so every configuration runs in two processes (-p1, -p2) whose mean place in time is the campaign's middle,
# and each slot mixes the types. Held-out processes run with HIDE (their figures stay out of the summary).
# Issue 28: llama-batched-bench, 3 rounds of -npp 512 (cal), 640, 1088 (held out), 1280 (cal), split then unified.
REPS=${LCP_REPS:-5}
LCP_TG=${LCP_TG:-64}                     # llama-batched-bench -ntg (runs 6-7's)
eval "$(sed -n '/^split_roles() {/,/^}/p' "$ROOT/tools/llamacpp/run6.sh")"
# Ordered (-nkvo 1): "name K V depth role", round A's order: slot (cal low, held, cal high, held), then type.
R8_ORD=("f16 f16 f16 640 cal" "q8_0 q8_0 q8_0 1024 cal" "q4_0 q4_0 q4_0 2048 cal" "mixed q8_0 q4_0 1024 cal"
        "f16 f16 f16 1216 held" "q8_0 q8_0 q8_0 2944 held" "q4_0 q4_0 q4_0 4992 held" "mixed q8_0 q4_0 1920 held"
        "f16 f16 f16 3072 cal" "q8_0 q8_0 q8_0 5120 cal" "q4_0 q4_0 q4_0 10240 cal" "mixed q8_0 q4_0 5120 cal"
        "f16 f16 f16 2240 held" "q8_0 q8_0 q8_0 4224 held" "q4_0 q4_0 q4_0 7936 held" "mixed q8_0 q4_0 3968 held")
# Resident (-nkvo 0), as run 7: "name K V depths-in-run-order calibration-depths", one process per type.
R8_RES=("f16 f16 f16 9728,8192,26624 8192"
        "q8_0 q8_0 q8_0 1024,9728,16384,26624 1024,16384"
        "q4_0 q4_0 q4_0 9728,8192,26624 8192"
        "mixed q8_0 q4_0 9728,8192,26624 8192")

ord_one() {  # $1: an R8_ORD row, $2: the process (p1: round A, p2: round B)
  local n k v d role
  read -r n k v d role <<< "$1"
  if [ $role = held ]; then HIDE=1 bench r8-ord-$n-d$d-held-$2 -ctk $k -ctv $v -nkvo 1 -d $d
  else bench r8-ord-$n-d$d-cal-$2 -ctk $k -ctv $v -nkvo 1 -d $d; fi
}

types_grid() {  # round A, the resident processes, round B (round A reversed)
  local i row n k v rd rc
  for ((i = 0; i < ${#R8_ORD[@]}; i++)); do ord_one "${R8_ORD[$i]}" p1; done
  for row in "${R8_RES[@]}"; do
    read -r n k v rd rc <<< "$row"
    HIDE=1 bench r8-res-$n-all -ctk $k -ctv $v -nkvo 0 -d "$rd" && split_roles r8-res-$n "$rc"
  done
  for ((i = ${#R8_ORD[@]} - 1; i >= 0; i--)); do ord_one "${R8_ORD[$i]}" p2; done
}

batched_grid() {  # h200_bench.sh's batched_rounds: 3 rounds, every held-out -npp between the two calibration ones
  batched_rounds r8 "${LCP_R8_PP:-512 640 1088 1280}" "${LCP_R8_PP_HELD:-640 1088}"
}

case $PHASE in
  run8|run8b|run8c)
    types_grid
    batched_grid
    ;;
esac
exit 0
