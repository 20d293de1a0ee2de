# Issue 28's batched campaigns, runs 10-14 (each one's design, rules and reasons: tools/llamacpp/README-runN.md),
# sourced by h200_bench.sh after the build for the phases runN, runNb and runNc (runN builds and starts, runNb and
# runNc, warm, go on where the last call stopped: finished calls are not repeated, h200_bench.sh's batched_one).
# llama-batched-bench only: every -npp of RR_PP, split then unified (-kvu), RR_ROUNDS rounds, odd rounds in that order
# and even rounds in reverse; a -npp of RR_HELD runs with HIDE (its figures stay out of the summary); RR_CTX lists
# PP=C, that -npp's -c (the others 8 x (npp + ntg) + 256). -ntg 64, -npl 1,2,4,8. Each run's settings below; each can
# be overridden by LCP_R<N>_PP, _PP_HELD, _CTX and _ROUNDS (the tests' dry runs do).

ctx_of() {  # -c of one -npp
  local kv
  for kv in $RR_CTX; do [ "${kv%%=*}" = "$1" ] && { echo "${kv#*=}"; return; }; done
  echo $(( 8 * ($1 + LCP_TG) + 256 ))
}

alternate_rounds() {  # $1: the calls' tag (r10, r11, ...): files $1-batched-{split,unified}-ppPP-rK
  local tag=$1 k i pp kvu hide calls=()
  for pp in $RR_PP; do for kvu in split unified; do calls+=("$pp $kvu"); done; done
  for ((k = 1; k <= RR_ROUNDS; k++)); do
    for ((i = 0; i < ${#calls[@]}; i++)); do
      if [ $((k % 2)) -eq 0 ]; then read -r pp kvu <<< "${calls[${#calls[@]} - 1 - i]}"
      else read -r pp kvu <<< "${calls[$i]}"; fi
      case " $RR_HELD " in *" $pp "*) hide=1;; *) hide=;; esac
      CTX=$(ctx_of "$pp") HIDE=$hide batched_one "$tag-batched-$kvu-pp$pp-r$k" "$pp" "$kvu"
    done
  done
}

LCP_TG=${LCP_TG:-64}  # llama-batched-bench -ntg (runs 6-13's)
case $PHASE in
  run10*)  # held out 704 and 960; -npp 960 at -c 16384: split streams of 2,048 cells against a 1,024-row window
    RR_PP=${LCP_R10_PP:-512 704 960 1280} RR_HELD=${LCP_R10_PP_HELD:-704 960} RR_CTX=${LCP_R10_CTX:-960=16384}
    RR_ROUNDS=${LCP_R10_ROUNDS:-6} ;;
  run11*)  # held out 576 and 1120; -npp 576 at -c 14336: streams of 1,792 cells against a 768-row window
    RR_PP=${LCP_R11_PP:-512 576 1120 1280} RR_HELD=${LCP_R11_PP_HELD:-576 1120} RR_CTX=${LCP_R11_CTX:-576=14336}
    RR_ROUNDS=${LCP_R11_ROUNDS:-12} ;;
  run12*)  # held out 800 and 1000, every -c by the rule
    RR_PP=${LCP_R12_PP:-512 800 1000 1280} RR_HELD=${LCP_R12_PP_HELD:-800 1000} RR_CTX=${LCP_R12_CTX:-}
    RR_ROUNDS=${LCP_R12_ROUNDS:-12} ;;
  run13*)  # held out 672 and 1056, every -c by the rule; the outlier rule is applied after the run
    RR_PP=${LCP_R13_PP:-512 672 1056 1280} RR_HELD=${LCP_R13_PP_HELD:-672 1056} RR_CTX=${LCP_R13_CTX:-}
    RR_ROUNDS=${LCP_R13_ROUNDS:-12} ;;
  run14*)  # held out 928 and 1200, every -c by the rule; the staging curve fitted at the calibration sizes after the run
    RR_PP=${LCP_R14_PP:-512 928 1200 1280} RR_HELD=${LCP_R14_PP_HELD:-928 1200} RR_CTX=${LCP_R14_CTX:-}
    RR_ROUNDS=${LCP_R14_ROUNDS:-12} ;;
  *) echo "rounds.sh: phase '$PHASE'; expected run10*, run11*, run12*, run13* or run14*" >&2; exit 2 ;;
esac
alternate_rounds "r${PHASE:3:2}"
exit 0
