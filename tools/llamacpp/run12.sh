# The run 12 campaign of issue 28 (the design, its rules and their reasons: tools/llamacpp/README-run12.md), sourced by
# h200_bench.sh after the build for the phases run12, run12b and run12c (run12 builds and starts, run12b and run12c,
# warm, go on where the last call stopped; finished calls are not repeated).
# Run 11's rounds with new held-out prompts: -npp 512 (calibration), 800, 1000 (held out), 1280 (calibration), each
# split then unified (-kvu); odd rounds in that order, even rounds in reverse; up to 12 rounds. Held-out calls run with
# HIDE. -ntg 64, -npl 1,2,4,8, every -c 8 x (npp + 64) + 256 as runs 8-11.
LCP_TG=${LCP_TG:-64}                     # llama-batched-bench -ntg (runs 6-11's)
RR_PP=${LCP_R12_PP:-512 800 1000 1280}
RR_HELD=${LCP_R12_PP_HELD:-800 1000}
RR_CTX=${LCP_R12_CTX:-}                 # PP=C: that -npp's -c; the others (all, here) 8 x (npp + ntg) + 256
RR_ROUNDS=${LCP_R12_ROUNDS:-12}
source "$ROOT/tools/llamacpp/rounds.sh"

case $PHASE in
  run12|run12b|run12c)
    alternate_rounds r12
    ;;
esac
exit 0
