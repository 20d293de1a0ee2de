# The run 13 campaign of issue 28 (the design, its rules and their reasons: tools/llamacpp/README-run13.md), sourced by
# h200_bench.sh after the build for the phases run13, run13b and run13c (run13 builds and starts, run13b and run13c,
# warm, go on where the last call stopped; finished calls are not repeated).
# Run 12's rounds with new held-out prompts: -npp 512 (calibration), 672, 1056 (held out), 1280 (calibration), each
# split then unified (-kvu); odd rounds in that order, even rounds in reverse; up to 12 rounds. Held-out calls run with
# HIDE. -ntg 64, -npl 1,2,4,8, every -c 8 x (npp + 64) + 256 as runs 8-12. The outlier rule
# (README-run13.md) is applied after the run, to calibration and held-out calls alike; the calls are run12's.
LCP_TG=${LCP_TG:-64}                     # llama-batched-bench -ntg (runs 6-12's)
RR_PP=${LCP_R13_PP:-512 672 1056 1280}
RR_HELD=${LCP_R13_PP_HELD:-672 1056}
RR_CTX=${LCP_R13_CTX:-}                 # PP=C: that -npp's -c; the others (all, here) 8 x (npp + ntg) + 256
RR_ROUNDS=${LCP_R13_ROUNDS:-12}
source "$ROOT/tools/llamacpp/rounds.sh"

alternate_rounds r13  # h200_bench.sh sources this file for the phases run13, run13b and run13c only
exit 0
