# The run 10 campaign of issue 28 (the design, its rules and their reasons: tools/llamacpp/README-run10.md), sourced by
# h200_bench.sh after the build for the phases run10, run10b and run10c (one machine: run10 builds and starts, run10b
# and run10c, warm, go on where the last call stopped; finished calls are not repeated).
# llama-batched-bench only, 6 rounds of eight configurations: -npp 512 (calibration), 704, 960 (held out), 1280
# (calibration), each split then unified (-kvu); odd rounds in that order, even rounds in reverse. Held-out calls run
# with HIDE (their figures stay out of the summary). -ntg 64, -npl 1,2,4,8, -c 8 x (npp + 64) + 256 as runs 8-9, but
# -npp 960 at -c 16384: a split cache of 8 streams of 2,048 cells against a window of 1,024 rows, where upstream's copy
# of a split cache's whole strided extent (docs/validation.md, "Run 9's largest miss") moves 1.5-1.9x kvpipe's bytes.
LCP_TG=${LCP_TG:-64}                     # llama-batched-bench -ntg (runs 6-9's)
RR_PP=${LCP_R10_PP:-512 704 960 1280}
RR_HELD=${LCP_R10_PP_HELD:-704 960}
RR_CTX=${LCP_R10_CTX:-960=16384}        # PP=C: that -npp's -c; the others 8 x (npp + ntg) + 256
RR_ROUNDS=${LCP_R10_ROUNDS:-6}
source "$ROOT/tools/llamacpp/rounds.sh"

case $PHASE in
  run10|run10b|run10c)
    alternate_rounds r10
    ;;
esac
exit 0
