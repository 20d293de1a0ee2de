# The run 10 campaign of issue 28 (the design, its rules and their reasons: tools/llamacpp/README-run10.md), sourced by
# h200_bench.sh after the build for the phases run10, run10b and run10c (one machine: run10 builds and starts, run10b
# and run10c, warm, go on where the last call stopped; finished calls are not repeated).
# llama-batched-bench only, 6 rounds of eight configurations: -npp 512 (calibration), 704, 960 (held out), 1280
# (calibration), each split then unified (-kvu); odd rounds in that order, even rounds in reverse. Held-out calls run
# with HIDE (their figures stay out of the summary). -ntg 64, -npl 1,2,4,8, -c 8 x (npp + 64) + 256 as runs 8-9, but
# -npp 960 at -c 16384: a split cache of 8 streams of 2,048 cells against a window of 1,024 rows, where upstream's copy
# of a split cache's whole strided extent (docs/validation.md, "Run 9's largest miss") moves 1.5-1.9x kvpipe's bytes.
LCP_TG=${LCP_TG:-64}                     # llama-batched-bench -ntg (runs 6-9's)
R10_PP=${LCP_R10_PP:-512 704 960 1280}
R10_HELD=${LCP_R10_PP_HELD:-704 960}
R10_CTX=${LCP_R10_CTX:-960=16384}        # PP=C: that -npp's -c; the others 8 x (npp + ntg) + 256

ctx_of() {  # -c of one -npp
  local kv
  for kv in $R10_CTX; do [ "${kv%%=*}" = "$1" ] && { echo "${kv#*=}"; return; }; done
  echo $(( 8 * ($1 + LCP_TG) + 256 ))
}

run10_rounds() {  # as h200_bench.sh's batched_rounds with "alternate", each -npp at its own -c
  local k i pp kvu hide calls=()
  for pp in $R10_PP; do for kvu in split unified; do calls+=("$pp $kvu"); done; done
  for ((k = 1; k <= ${LCP_R10_ROUNDS:-6}; k++)); do
    for ((i = 0; i < ${#calls[@]}; i++)); do
      if [ $((k % 2)) -eq 0 ]; then read -r pp kvu <<< "${calls[${#calls[@]} - 1 - i]}"
      else read -r pp kvu <<< "${calls[$i]}"; fi
      case " $R10_HELD " in *" $pp "*) hide=1;; *) hide=;; esac
      CTX=$(ctx_of "$pp") HIDE=$hide batched_one "r10-batched-$kvu-pp$pp-r$k" "$pp" "$kvu"
    done
  done
}

case $PHASE in
  run10|run10b|run10c)
    run10_rounds
    ;;
esac
exit 0
