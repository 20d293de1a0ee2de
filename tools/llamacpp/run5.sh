# The run 5 campaign of issues 30 and 28 (the design and its reasons: tools/llamacpp/README-run5.md), sourced by
# h200_bench.sh after the build for the phases run5 (the fitting machine: calibration, then the held-out grid),
# run5b (the same machine, warm: its build packed into $OUT for the fresh machine, then llama-batched-bench held out,
# each configuration 3 times) and run5f (a fresh machine: the held-out grid again, nothing of it fitted).
# A layer's K (or V) copy under -nkvo 1 is the window, pad256(depth + tokens) rows x row bytes (f16 2,048, q8_0 1,088,
# q4_0 576 bytes a row of 1,024 values): the ordered depths below put each type's copies below and above ~3 MiB.
REPS=${LCP_REPS:-3}
types_held() {  # the held-out llama-bench grid: depths no earlier run used (HIDE keeps the figures out of the summary)
  HIDE=1 bench r5-ord-q8_0-held -ctk q8_0 -ctv q8_0 -nkvo 1 -d "${LCP_R5_ORD_Q8_HELD:-1280,5120}"
  HIDE=1 bench r5-ord-f16-held -ctk f16 -ctv f16 -nkvo 1 -d "${LCP_R5_ORD_F16_HELD:-768,2560}"
  HIDE=1 bench r5-ord-q4_0-held -ctk q4_0 -ctv q4_0 -nkvo 1 -d "${LCP_R5_ORD_Q4_HELD:-3584,12288}"
  HIDE=1 bench r5-ord-mixed-held -ctk q8_0 -ctv q4_0 -nkvo 1 -d "${LCP_R5_ORD_MIXED_HELD:-1792,6656}"
  for t in q8_0 f16 q4_0; do
    HIDE=1 bench r5-res-$t-held -ctk $t -ctv $t -nkvo 0 -d "${LCP_R5_RES_HELD:-5120,20480}"
  done
  HIDE=1 bench r5-res-mixed-held -ctk q8_0 -ctv q4_0 -nkvo 0 -d "${LCP_R5_RES_HELD:-5120,20480}"
}
case $PHASE in
  run5)
    bench r5-res-q8_0-cal -ctk q8_0 -ctv q8_0 -nkvo 0 -d "${LCP_R5_RES_Q8_CAL:-1024,16384}"
    bench r5-res-f16-cal -ctk f16 -ctv f16 -nkvo 0 -d "${LCP_R5_RES_CAL:-8192}"
    bench r5-res-q4_0-cal -ctk q4_0 -ctv q4_0 -nkvo 0 -d "${LCP_R5_RES_CAL:-8192}"
    bench r5-ord-q8_0-cal -ctk q8_0 -ctv q8_0 -nkvo 1 -d "${LCP_R5_ORD_Q8_CAL:-1024,2048,4096}"
    bench r5-ord-f16-cal -ctk f16 -ctv f16 -nkvo 1 -d "${LCP_R5_ORD_F16_CAL:-512,1536,4096}"
    bench r5-ord-q4_0-cal -ctk q4_0 -ctv q4_0 -nkvo 1 -d "${LCP_R5_ORD_Q4_CAL:-2048,4096,8192}"
    types_held
    ;;
  run5b)
    if [ ! -f "$LCP/done/binpack" ]; then  # the build for run5f: bin/ (llama-bench, llama-batched-bench, their .so)
      tar cf - -C "$BUILD" bin | xz -T"$JOBS" -6 > "$RUN/bin.tar.xz" && split -b 15M -d "$RUN/bin.tar.xz" "$OUT/bin.tar.xz."
      sha256sum "$RUN/bin.tar.xz" > "$RUN/bin.sha256"; rm -f "$RUN/bin.tar.xz"; touch "$LCP/done/binpack"
      log "build packed: $(ls -l "$OUT"/bin.tar.xz.* | awk '{s += $5} END {print s}') bytes in $(ls "$OUT"/bin.tar.xz.* | wc -l) parts"
    fi
    for pp in ${LCP_R5_PP_HELD:-1536 2560}; do  # a -npp value's 3 calls before the next value's
      for k in 1 2 3; do
        for kvu in split unified; do HIDE=1 batched_one r5-batched-$kvu-pp$pp-r$k $pp $kvu; done
      done
    done
    ;;
  run5f)
    types_held
    ;;
esac
exit 0
