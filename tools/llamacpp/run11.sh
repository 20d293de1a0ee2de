# The run 11 campaign of issue 28 (the design, its rules and their reasons: tools/llamacpp/README-run11.md), sourced by
# h200_bench.sh after the build for the phases run11, run11b and run11c (run11 builds and starts, run11b and run11c,
# warm, go on where the last call stopped; finished calls are not repeated).
# llama-batched-bench only, up to 12 rounds of eight configurations: -npp 512 (calibration), 576, 1120 (held out), 1280
# (calibration), each split then unified (-kvu); odd rounds in that order, even rounds in reverse; as many rounds as
# the device time allows (run 10 had 6: the calls scatter ~10% each, and more calls per configuration is the lever).
# Held-out calls run with HIDE. -ntg 64, -npl 1,2,4,8, -c 8 x (npp + 64) + 256 as runs 8-10, but -npp 576 at -c 14336:
# a split cache of 8 streams of 1,792 cells against a window of 768 rows (upstream's span copy 1.67-2.17x the fork's).
LCP_TG=${LCP_TG:-64}                     # llama-batched-bench -ntg (runs 6-10's)
RR_PP=${LCP_R11_PP:-512 576 1120 1280}
RR_HELD=${LCP_R11_PP_HELD:-576 1120}
RR_CTX=${LCP_R11_CTX:-576=14336}        # PP=C: that -npp's -c; the others 8 x (npp + ntg) + 256
RR_ROUNDS=${LCP_R11_ROUNDS:-12}
source "$ROOT/tools/llamacpp/rounds.sh"

case $PHASE in
  run11|run11b|run11c)
    alternate_rounds r11
    ;;
esac
exit 0
