#!/usr/bin/env bash
# Build upstream llama.cpp's llama-bench with CUDA on the lent H200 and run the -nkvo 0/1 decode grid of issue 19 on a
# random-weight GGUF shaped like sim/presets/llama-3.1-8b.json. Run on the device from the repo root:
#   run(command="bash tools/llamacpp/h200_bench.sh all", carry=[".lcp"])        # build, then as many benches as fit
#   run(command="bash tools/llamacpp/h200_bench.sh bench", carry=[".lcp"])      # next call, while the machine is warm
#   run(command="bash tools/llamacpp/h200_bench.sh fa0", carry=[".lcp"])        # build, then -fa 0 (attention on the CPU
#                                                                                 under -nkvo: kvpipe's host-attention arm)
#   run(command="bash tools/llamacpp/h200_bench.sh ngl", carry=[".lcp"])        # build, then the -ngl grid of issue 24
#                                                                                 (layers before the last -ngl on the CPU)
#   run(command="bash tools/llamacpp/h200_bench.sh types", carry=[".lcp"])      # build, then the cache-type grid of
#                                                                                 issue 30 (f16, q8_0, q4_0, q8_0/q4_0)
#   run(command="bash tools/llamacpp/h200_bench.sh batched", carry=[".lcp"])    # build, then llama-batched-bench -nkvo
#                                                                                 at 1/2/4/8 sequences (issue 28)
#   run5, run5b, run5f: the held-out campaign of issues 30 and 28 (tools/llamacpp/README-run5.md): run5 builds and runs
#   the cache-type calibration and held-out grid, run5b (warm) packs the build into $OUT and runs llama-batched-bench
#   held out 3 times, run5f (a fresh machine) unpacks that build (LCP_BIN_TAR) or builds, then the held-out grid again.
#   run6, run6b, run6f: run 6 (tools/llamacpp/README-run6.md): run6 builds, then per cache type one process per arm
#   interleaving calibration and held-out depths, then llama-batched-bench; run6b (warm) finishes what run6 left;
#   run6f (a fresh machine) builds llama-bench and runs the held-out depths again.
#   run7, run7b, run7f: run 7 (tools/llamacpp/README-run7.md): run7 builds, then every ordered configuration in its own
#   process (calibration and held-out processes alternating), each type's resident process, then llama-batched-bench;
#   run7b (warm) finishes what run7 left; run7f (a fresh machine) builds llama-bench and runs the held-out ones again.
#   run8, run8b, run8c: run 8 (tools/llamacpp/README-run8.md): run8 builds, then the cache types interleaved in time
#   (two processes per ordered configuration), then llama-batched-bench; run8b and run8c (warm) go on where it stopped.
#   run9, run9b, run9c: run 9 (tools/llamacpp/README-run9.md): run9 builds, then 6 rounds of llama-batched-bench only;
#   run9b and run9c (warm) go on where it stopped.
#   run10, run10b, run10c: run 10 (tools/llamacpp/README-run10.md): as run 9, held out -npp 704 and 960 (-c 16384).
#   run11, run11b, run11c: run 11 (tools/llamacpp/README-run11.md): as run 10, up to 12 rounds, held out -npp 576
#   (-c 14336) and 1120.
#   run12, run12b, run12c: run 12 (tools/llamacpp/README-run12.md): as run 11 (up to 12 rounds), held out -npp 800
#   and 1000 at their own -c, the fit pooling each configuration's calls.
#   run13, run13b, run13c: run 13 (tools/llamacpp/README-run13.md): as run 12, held out -npp 672 and 1056, calls
#   outside their configuration's spread left out (declared before the run).
#   run14, run14b, run14c: run 14 (tools/llamacpp/README-run14.md): as run 13, held out -npp 928 and 1200, the staging
#   curve fitted at the one-sequence rows' copy sizes (declared before the run).
#   span: the split-cache copy check (tools/llamacpp/README-span.md): builds, then llama-batched-bench at -npp 1216 with
#   two -c values (streams of 1,536 and 1,280 cells), split and unified, in rounds.
# .lcp/llama.cpp-src.tar.xz is the stripped llama.cpp tree from the llama-cpp-python 0.3.36 sdist (see its
# KVPIPE-SOURCE.txt). Every step is idempotent: the tree, the build (ninja resumes), the GGUF and each finished bench set
# live under $LCP (/tmp, so only while the machine stays warm: 30 s after a call) and are reused by the next call.
# Outputs: $OUT/<phase>.tar.gz (bench JSON, stderr, logs, machine info, commands) and $OUT/summary-<phase>.txt;
# the device returns at most 8 files, hence the tarball.
# Knobs for a dry run on a CPU machine: LCP_CUDA=OFF LCP_LAYERS=2 LCP_JOBS=2 LCP_REPS=1 LCP_NGEN=8 and the LCP_D_* lists.
set -u -o pipefail
export PYTHONUNBUFFERED=1
PHASE=${1:-all}
case $PHASE in all|build|bench|fa0|ngl|types|batched|run5|run5b|run5f|run6|run6b|run6f|run7|run7b|run7f|run8|run8b|run8c|run9|run9b|run9c|run10|run10b|run10c|run11|run11b|run11c|run12|run12b|run12c|run13|run13b|run13c|run14|run14b|run14c|span) ;; *) echo "h200_bench.sh: phase '$PHASE'; expected all, build, bench, fa0, ngl, types, batched, run5, run5b, run5f, run6, run6b, run6f, run7, run7b, run7f, run8, run8b, run8c, run9, run9b, run9c, run10, run10b, run10c, run11, run11b, run11c, run12, run12b, run12c, run13, run13b, run13c, run14, run14b, run14c or span" >&2; exit 2;; esac
ROOT=$(pwd)
T0=$(date +%s)
DEADLINE=${LCP_DEADLINE:-570}             # seconds into this call: the device kills a call at 600 s
LCP=${LCP:-/tmp/lcp}
SRC=$LCP/llama.cpp
BUILD=${LCP_BUILD:-$LCP/build}
CUDA=${LCP_CUDA:-ON}
JOBS=${LCP_JOBS:-16}
LAYERS=${LCP_LAYERS:-}                   # empty: the preset's 32
REPS=${LCP_REPS:-5}
NGL=99                                    # llama-bench -ngl; the ngl phase sets it per bench
FA=${LCP_FA:-1}                           # llama-bench -fa: 1 (attention on the GPU even under -nkvo), 0 (fa0 phase)
NGEN=${LCP_NGEN:-64}
D_RESIDENT=${LCP_D_RESIDENT:-1024,2048,4096,8192,16384,32768,65536}
D_ORDERED_FIRST=${LCP_D_ORDERED_FIRST:-512}          # alone first: its time sizes the rest of the ordered arm
D_ORDERED=${LCP_D_ORDERED:-1024,2048,4096,8192}
D_F16=${LCP_D_F16:-2048,8192}
D_SCHED=${LCP_D_SCHED:-512}
MODEL=$LCP/llama-3.1-8b-q8_0${LAYERS:+-${LAYERS}l}.gguf
BENCH=$BUILD/bin/llama-bench
BBENCH=$BUILD/bin/llama-batched-bench
RUN=$LCP/out-$PHASE-$T0                  # this call's files, tarred into $OUT at the end
OUT=${OUT:-$LCP/out}
mkdir -p "$RUN" "$OUT" "$LCP/done"
el() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( DEADLINE - $(el) )); }
log() { echo "[$(el) s] $*" | tee -a "$RUN/summary.txt"; }

finish() {
  log "phase $PHASE ends"
  cp "$RUN/summary.txt" "$OUT/summary-$PHASE.txt"
  tar czf "$OUT/$PHASE.tar.gz" -C "$(dirname "$RUN")" "$(basename "$RUN")"
}
trap finish EXIT

machine_info() {
  { echo "## date"; date -u +%FT%TZ; echo "## nproc"; nproc; echo "## lscpu"; lscpu 2>&1 | grep -E "^(Model name|Socket|Core|Thread|CPU\(s\)|NUMA|L3|Flags)" | cut -c1-300
    echo "## free -g"; free -g; echo "## df /tmp"; df -h /tmp; echo "## uname"; uname -a
    echo "## boot_id"; cat /proc/sys/kernel/random/boot_id; echo "## nvidia-smi -L (GPU UUID)"; nvidia-smi -L 2>&1
    echo "## nvidia-smi"; nvidia-smi 2>&1; echo "## nvidia-smi -q (clocks, pcie)"; nvidia-smi -q 2>&1 | grep -A3 -E "PCI$|Link Width|Link Gen|Max Clocks|Clocks$" | head -60
    echo "## nvcc"; nvcc --version 2>&1 | tail -2; echo "## cmake"; cmake --version | head -1; echo "## ninja"; ninja --version
    echo "## python"; python3 -c "import sys, numpy; print(sys.version.split()[0], 'numpy', numpy.__version__)"; } > "$RUN/machine.txt" 2>&1
}

build() {
  local targets=(llama-bench); case $PHASE in types|batched|run5*|run6|run6b|run7|run7b|run8*|run9*|run10*|run11*|run12*|run13*|run14*|span) targets+=(llama-batched-bench);; esac
  if [ -n "${LCP_BIN_TAR:-}" ] && [ ! -x "$BENCH" ]; then  # a build packed by run5b on the first machine
    mkdir -p "$BUILD" && cat $LCP_BIN_TAR | xz -dc | tar xf - -C "$BUILD" && log "unpacked the first machine's build ($LCP_BIN_TAR)"
  fi
  if [ -x "$BENCH" ] && { [ ${#targets[@]} -eq 1 ] || [ -x "$BBENCH" ]; }; then log "${targets[*]} already built (warm machine)"; return 0; fi
  if [ ! -f "$SRC/CMakeLists.txt" ]; then
    mkdir -p "$LCP" && tar xJf "$ROOT/.lcp/llama.cpp-src.tar.xz" -C "$LCP" || { log "cannot unpack $ROOT/.lcp/llama.cpp-src.tar.xz"; exit 3; }
    log "unpacked $(cat "$SRC/KVPIPE-SOURCE.txt" | sed -n 3p)"
  fi
  # The tree has no .git: the build number and commit are given (they end up in llama-bench's build_commit/build_number).
  local cfg=(-S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=$CUDA -DCMAKE_CUDA_ARCHITECTURES=90
             -DLLAMA_BUILD_COMMIT=0c1e570 -DLLAMA_BUILD_NUMBER=11312 -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
             -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DGGML_CCACHE=OFF)
  if [ ! -f "$BUILD/build.ninja" ]; then
    echo "cmake ${cfg[*]}" >> "$RUN/commands.txt"
    cmake "${cfg[@]}" > "$RUN/cmake.log" 2>&1 || { log "cmake failed (cmake.log)"; tail -20 "$RUN/cmake.log"; exit 4; }
    log "configured"
  fi
  local budget=$(( $(left) - 15 )) b0=$(date +%s)
  echo "cmake --build $BUILD --target ${targets[*]} -j $JOBS   # timeout $budget s" >> "$RUN/commands.txt"
  timeout "$budget" cmake --build "$BUILD" --target "${targets[@]}" -j "$JOBS" > "$RUN/build.log" 2>&1; local rc=$?
  local dt=$(( $(date +%s) - b0 ))
  echo "$dt" >> "$LCP/build_seconds"   # summed over calls if the build spans two
  log "build rc=$rc in $dt s (this call); build seconds over calls: $(paste -sd+ "$LCP/build_seconds") = $(( $(paste -sd+ "$LCP/build_seconds") )); $(grep -o '^\[[0-9]*/[0-9]*\]' "$RUN/build.log" | tail -1) steps"
  [ $rc -eq 0 ] || { log "build stopped (rc=$rc: 124 = out of time; run the phase again while warm to resume)"; return 1; }
  "$BENCH" --help > "$RUN/llama-bench-help.txt" 2>&1
}

write_model() {  # run in the background beside the build: it needs only numpy and the vendored gguf-py
  [ -f "$MODEL" ] && return 0
  [ -f "$SRC/gguf-py/gguf/__init__.py" ] || { mkdir -p "$LCP" && tar xJf "$ROOT/.lcp/llama.cpp-src.tar.xz" -C "$LCP"; }
  local cmd=(python3 "$ROOT/tools/llamacpp/write_gguf.py" --preset "$ROOT/sim/presets/llama-3.1-8b.json" --out "$MODEL.part"
             --weights q8_0 --vocab-from "$SRC/models/ggml-vocab-llama-bpe.gguf" --gguf-py "$SRC/gguf-py" ${LAYERS:+--layers $LAYERS})
  echo "${cmd[*]}" >> "$RUN/commands.txt"
  "${cmd[@]}" > "$RUN/write_gguf.log" 2>&1 && mv "$MODEL.part" "$MODEL"
}

# One llama-bench call: its JSON (as llama-bench wrote it) and its stderr with a time stamp per line, killed at the
# call's deadline (the JSON printer flushes each test, so finished tests survive a kill).
bench() {
  local name=$1; shift
  if [ -f "$LCP/done/$name" ]; then log "$name: done in an earlier call"; return 0; fi
  local budget=$(( $(left) - 10 ))
  if [ $budget -lt 20 ]; then log "$name: skipped, $budget s left"; return 1; fi
  local cmd=("$BENCH" -m "$MODEL" -ngl "$NGL" -fa "$FA" -p 0 -n "$NGEN" -r "$REPS" -o json --progress "$@")
  echo "$name: ${cmd[*]}" >> "$RUN/commands.txt"
  local b0=$(date +%s)
  echo "$name $b0" >> "$RUN/starts.txt"   # the process's start, epoch seconds (run 8's time-drift candidate reads it)
  timeout "$budget" "${cmd[@]}" > "$RUN/$name.json" 2> >(while IFS= read -r l; do echo "$(( $(date +%s) - b0 )) $l"; done > "$RUN/$name.err")
  local rc=$?
  log "$name: rc=$rc in $(( $(date +%s) - b0 )) s: $(python3 - "$RUN/$name.json" "${HIDE:-}" <<'PY'
import json, sys
t = open(sys.argv[1]).read().rstrip().rstrip(",")
try:
    rows = json.loads(t if t.endswith("]") else t + "]")
except ValueError:
    rows = []
if sys.argv[2]:  # a held-out run: its figures stay unread until the prediction is written
    print(f"{len(rows)} rows (held out: figures not shown)")
else:
    print("; ".join(f"{r['type_k']} ngl={r['n_gpu_layers']} nkvo={int(r['no_kv_offload'])} d={r['n_depth']}: "
                    f"{r['avg_ts']:.2f} t/s" for r in rows) or "no result")
PY
)"
  [ $rc -eq 0 ] && touch "$LCP/done/$name"
  return $rc
}

# The scheduler's split listing of short runs (GGML_SCHED_DEBUG=2 prints every split with the inputs it copies in;
# -v lets llama-bench pass ggml's debug log through), then a per-graph count of splits, copied inputs and their bytes.
sched_listing() {
  local nkvo=$1 name=sched-nkvo$1${2:-} ct=${3:-q8_0}
  if [ -f "$LCP/done/$name" ]; then log "$name: done in an earlier call"; return 0; fi
  [ $(left) -lt 40 ] && { log "$name: skipped, $(left) s left"; return 1; }
  local cmd=("$BENCH" -m "$MODEL" -ngl "$NGL" -fa "$FA" -p 0 -n 2 -r 1 --no-warmup -d "$D_SCHED" -ctk "$ct" -ctv "$ct" -nkvo "$nkvo" -o json -v)
  echo "$name: GGML_SCHED_DEBUG=2 ${cmd[*]}" >> "$RUN/commands.txt"
  GGML_SCHED_DEBUG=2 timeout $(( $(left) - 10 )) "${cmd[@]}" > "$RUN/$name.json" 2> "$RUN/$name.log"
  log "$name: rc=$?"
  python3 - "$RUN/$name.log" > "$RUN/$name-splits.txt" <<'PY'
import re, sys
# "## SPLIT #k: BACKEND # n inputs: [name (size)] ..." starts each split; "## SPLIT #0" starts a new graph.
units = {"K": 1 << 10, "M": 1 << 20}
graphs = []
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"## SPLIT #(\d+): (\S+) # (\d+) inputs", line)
    if not m:
        continue
    if m.group(1) == "0":
        graphs.append([])
    # an input's name can hold spaces ("cache_k_l0 (view) (permuted)"); its size is the last "( nK)" before "]"
    ins = re.findall(r"\[([^\]]*?) \(\s*(\d+)([KM])\)\]", line)
    graphs[-1].append((m.group(2), int(m.group(3)), sum(int(s) * units[u] for _, s, u in ins),
                       [f"{n.strip() or '(unnamed)'}={s}{u}" for n, s, u in ins]))
for i, g in enumerate(graphs):
    n_in = sum(s[1] for s in g)
    print(f"graph {i}: {len(g)} splits, {n_in} inputs copied, {sum(s[2] for s in g) / 2**20:.2f} MiB "
          f"(sizes rounded down to K/M by ggml); backends {'>'.join(s[0] for s in g)[:200]}")
if graphs:
    print("last graph (a decode step), split by split:")
    for k, (be, n, b, names) in enumerate(graphs[-1]):
        print(f"  split {k} {be}: {n} inputs, {b / 2**10:.0f} KiB: {' '.join(names)[:400]}")
PY
  gzip -f "$RUN/$name.log"
  touch "$LCP/done/$name"
}

log "phase $PHASE on $(hostname), $(nproc) cores; repo $ROOT"
machine_info
if [ "$PHASE" != bench ] || [ ! -x "$BENCH" ]; then
  write_model & WPID=$!
  build; BRC=$?
  wait $WPID; log "GGUF: $(tail -1 "$RUN/write_gguf.log" 2>/dev/null || echo "$MODEL already there")"
  [ $BRC -eq 0 ] || exit 5
fi
[ "$PHASE" = build ] && exit 0
[ -f "$MODEL" ] || write_model || { log "GGUF write failed"; cat "$RUN/write_gguf.log"; exit 6; }
echo "build_commit 0c1e570 (0c1e57098bba43ac29e6e3b677cdceebdd22334f) build_number 11312; $BENCH" > "$RUN/build-info.txt"
"$BENCH" --version >> "$RUN/build-info.txt" 2>&1 || true
# Priority order: the resident arm, the ordered arm at its smallest depth alone (its time sizes the rest), the other
# ordered depths, the split listings, then the f16 cache. At commit 0c1e570 -nkvo 1 -fa 1 runs flash attention on the
# GPU and copies each layer's whole K/V view host->device per ubatch (validate/results/h200-llamacpp/run1/README.md),
# so the -nkvo 1 depth prefill is cheap; with -fa 0 upstream pins attention to the CPU and it would be quadratic there.
if [ "$PHASE" = fa0 ]; then
  # -fa 0: upstream pins attention to the CPU under -nkvo (a quantized V cache needs flash attention, so f16). The
  # -nkvo 1 depth prefill then runs attention on the 16 host cores, quadratic in the depth: small depths only.
  FA=0
  bench fa0-f16 -ctk f16 -ctv f16 -nkvo 0,1 -d "${LCP_D_FA0:-256,512,1024,2048}"
  sched_listing 1 -fa0 f16
  exit 0
fi
if [ "$PHASE" = ngl ]; then
  # -ngl N puts the last N of the n_layer + 1 layers (the output layer counts as the last) on the GPU, so -ngl 33 is
  # every layer of the 32-layer model and -ngl 25 leaves layers 0..7 (8 layers) on the CPU. Calibration runs first, then
  # the held-out ones (HIDE: their figures stay out of the summary), then the second depth, then a split listing.
  REPS=${LCP_REPS:-3}
  for d in ${LCP_D_NGL:-4096 1024}; do
    for n in ${LCP_NGL_FIT:-33 25 9}; do NGL=$n bench ngl$n-d$d -ctk q8_0 -ctv q8_0 -nkvo 0,1 -d "$d"; done
    for n in ${LCP_NGL_HELD:-29 17}; do NGL=$n HIDE=1 bench ngl$n-d$d -ctk q8_0 -ctv q8_0 -nkvo 0,1 -d "$d"; done
  done
  NGL=25 sched_listing 0 -ngl25
  exit 0
fi
if [ "$PHASE" = types ]; then
  # Issue 30: each cache type at both arms. Per type, one resident depth and one ordered depth are calibration inputs;
  # the other depths are held out (HIDE: their figures stay out of the summary), and the mixed q8_0/q4_0 cache is held
  # out whole (the model composes it from the K and V types).
  for t in ${LCP_TYPES:-q4_0 f16 q8_0}; do
    bench types-res-$t-cal -ctk $t -ctv $t -nkvo 0 -d "${LCP_D_TYPES_RES_CAL:-8192}"
    bench types-ord-$t-cal -ctk $t -ctv $t -nkvo 1 -d "${LCP_D_TYPES_ORD_CAL:-1024}"
  done
  for t in ${LCP_TYPES:-q4_0 f16 q8_0}; do
    HIDE=1 bench types-res-$t-held -ctk $t -ctv $t -nkvo 0 -d "${LCP_D_TYPES_RES_HELD:-2048,32768}"
    HIDE=1 bench types-ord-$t-held -ctk $t -ctv $t -nkvo 1 -d "${LCP_D_TYPES_ORD_HELD:-3072}"
  done
  HIDE=1 bench types-mixed-held -ctk q8_0 -ctv q4_0 -nkvo 0,1 -d "${LCP_D_TYPES_MIXED:-4096}"
  exit 0
fi
# Rounds of llama-batched-bench calls (issue 28, runs 6-9): $1 the names' prefix, $2 the -npp values in each round's
# order (runs 6-8: each held-out one between calibration ones), $3 the held-out -npp values (their calls run with HIDE),
# $4 the number of rounds (default 3, runs 6-8), $5 "alternate" (run 9): even rounds run the odd rounds' calls in
# reverse order (-npp descending, unified then split); otherwise every round is $2's order, each -npp split then unified.
batched_rounds() {
  local k i pp kvu hide calls=()
  for pp in $2; do for kvu in split unified; do calls+=("$pp $kvu"); done; done
  for ((k = 1; k <= ${4:-3}; k++)); do
    for ((i = 0; i < ${#calls[@]}; i++)); do
      if [ "${5:-}" = alternate ] && [ $((k % 2)) -eq 0 ]; then read -r pp kvu <<< "${calls[${#calls[@]} - 1 - i]}"
      else read -r pp kvu <<< "${calls[$i]}"; fi
      case " $3 " in *" $pp "*) hide=1;; *) hide=;; esac
      HIDE=$hide batched_one "$1-batched-$kvu-pp$pp-r$k" "$pp" "$kvu"
    done
  done
}

# One llama-batched-bench call (issue 28): the cache in host RAM (-nkvo), flash attention on the GPU, npl sequences each
# with its own PP-token prompt (not shared), TG tokens generated per sequence; unified (-kvu) or one stream per sequence.
# HIDE: a held-out call, its figures kept out of the summary. llama-batched-bench prints log lines beside its JSONL rows.
batched_one() {
  local name=$1 pp=$2 kvu=$3
  if [ -f "$LCP/done/$name" ]; then log "$name: done in an earlier call"; return 0; fi
  [ $(left) -lt 30 ] && { log "$name: skipped, $(left) s left"; return 1; }
  local ctx=${CTX:-$(( 8 * (pp + ${LCP_TG:-32}) + 256 ))}  # CTX: a call's own -c (the span check)
  local cmd=("$BBENCH" -m "$MODEL" -ngl "$NGL" -fa on -nkvo -ctk q8_0 -ctv q8_0 -c "$ctx" -b 2048 -ub 512
             -npp "$pp" -ntg "${LCP_TG:-32}" -npl "${LCP_NPL:-1,2,4,8}" --output-format jsonl)
  [ $kvu = unified ] && cmd+=(-kvu)
  echo "$name: ${cmd[*]}" >> "$RUN/commands.txt"
  local b0=$(date +%s)
  timeout $(( $(left) - 10 )) "${cmd[@]}" > "$RUN/$name.jsonl" 2> "$RUN/$name.err"; local rc=$?
  local summ
  if [ -z "${HIDE:-}" ]; then
    summ=$(python3 - "$RUN/$name.jsonl" <<'PY' 2>&1
import json, sys
rows = []
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if isinstance(r, dict) and "pl" in r:
        rows.append(f"pl={r['pl']}: {r['speed_tg']:.2f} t/s")
print("; ".join(rows) or "no result")
PY
)
  else summ="$(grep -c '"pl"' "$RUN/$name.jsonl") rows (held out: figures not shown)"; fi
  log "$name: rc=$rc in $(( $(date +%s) - b0 )) s: $summ"
  [ $rc -eq 0 ] && touch "$LCP/done/$name"
  return $rc
}

if [ "$PHASE" = batched ]; then
  # Issue 28 (run 4): calibration PP 2048; held out: the other PP values (HIDE).
  for kvu in split unified; do batched_one batched-$kvu-pp${LCP_PP_CAL:-2048} ${LCP_PP_CAL:-2048} $kvu; done
  for pp in ${LCP_PP_HELD:-1024 4096}; do
    for kvu in split unified; do HIDE=1 batched_one batched-$kvu-pp$pp $pp $kvu; done
  done
  exit 0
fi
case $PHASE in run10*|run11*|run12*|run13*|run14*) source "$ROOT/tools/llamacpp/rounds.sh";; run5*|run6*|run7*|run8*|run9*|span) source "$ROOT/tools/llamacpp/${PHASE:0:4}.sh";; esac
bench resident-q8_0 -ctk q8_0 -ctv q8_0 -nkvo 0 -d "$D_RESIDENT"
bench ordered-q8_0-first -ctk q8_0 -ctv q8_0 -nkvo 1 -d "$D_ORDERED_FIRST"
bench ordered-q8_0 -ctk q8_0 -ctv q8_0 -nkvo 1 -d "$D_ORDERED"
sched_listing 1
sched_listing 0
bench f16-cache -ctk f16 -ctv f16 -nkvo 0,1 -d "$D_F16"
exit 0
