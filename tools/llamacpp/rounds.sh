# Rounds of llama-batched-bench calls for issue 28's runs 10 and 11 (sourced by their run*.sh after h200_bench.sh's
# build): every -npp of RR_PP, split then unified (-kvu), RR_ROUNDS rounds, odd rounds in that order and even rounds in
# reverse; a -npp of RR_HELD runs with HIDE (its figures stay out of the summary); RR_CTX lists PP=C, that -npp's -c
# (the others 8 x (npp + ntg) + 256). Finished calls are not repeated by a warm follow-up call (h200_bench.sh's
# batched_one), so the b and c phases go on where the last call stopped.

ctx_of() {  # -c of one -npp
  local kv
  for kv in $RR_CTX; do [ "${kv%%=*}" = "$1" ] && { echo "${kv#*=}"; return; }; done
  echo $(( 8 * ($1 + LCP_TG) + 256 ))
}

alternate_rounds() {  # $1: the calls' tag (r10, r11): files $1-batched-{split,unified}-ppPP-rK
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
