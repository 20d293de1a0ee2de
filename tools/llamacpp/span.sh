# The split-cache copy check of issue 28 (tools/llamacpp/README-span.md), sourced by h200_bench.sh after the build for
# the phase span. llama-batched-bench at -npp 1216 -ntg 64 -npl 2,8, split and unified (-kvu), each at -c 12288 (a
# split cache's streams 1,536 cells: run 9's) and -c 10240 (streams 1,280 cells: the window), in rounds of the four;
# even rounds in reverse order. No call is held out: this measures a mechanism, it predicts nothing.
LCP_TG=${LCP_TG:-64}
LCP_NPL=${LCP_SPAN_NPL:-2,8}

span_rounds() {
  local k i kvu c calls=("split 12288" "split 10240" "unified 12288" "unified 10240")
  for ((k = 1; k <= ${LCP_SPAN_ROUNDS:-3}; k++)); do
    for ((i = 0; i < ${#calls[@]}; i++)); do
      if [ $((k % 2)) -eq 0 ]; then read -r kvu c <<< "${calls[${#calls[@]} - 1 - i]}"
      else read -r kvu c <<< "${calls[$i]}"; fi
      CTX=$c batched_one "span-$kvu-c$c-r$k" 1216 "$kvu"
    done
  done
}

span_rounds
exit 0
