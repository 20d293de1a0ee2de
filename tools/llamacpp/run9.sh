# The run 9 campaign of issue 28 (the design, its rules and their reasons: tools/llamacpp/README-run9.md), sourced by
# h200_bench.sh after the build for the phases run9, run9b and run9c (one machine: run9 builds and starts, run9b and
# run9c, warm, go on where the last call stopped; finished calls are not repeated).
# llama-batched-bench only, 6 rounds of the eight configurations: -npp 512 (calibration), 832, 1216 (held out), 1280
# (calibration), each split then unified (-kvu); odd rounds in that order, even rounds in reverse (-npp descending,
# unified then split). Held-out calls run with HIDE (their figures stay out of the summary). -ntg 64, -npl 1,2,4,8,
# -c 8 x (npp + 64) + 256, as run 8.
LCP_TG=${LCP_TG:-64}                     # llama-batched-bench -ntg (runs 6-8's)

batched_grid() {  # h200_bench.sh's batched_rounds: 6 rounds, even rounds reversed
  batched_rounds r9 "${LCP_R9_PP:-512 832 1216 1280}" "${LCP_R9_PP_HELD:-832 1216}" "${LCP_R9_ROUNDS:-6}" alternate
}

case $PHASE in
  run9|run9b|run9c)
    batched_grid
    ;;
esac
exit 0
