#!/usr/bin/env bash
# Regenerate the figures of docs/capacity-planning.md (a few minutes on two cores).
# Sweeps land in out/ (ignored by git); the plots in docs/figures/.
set -euo pipefail
cd "$(dirname "$0")/../.."
F=docs/figures

# Reference preset: qwen3.8-27b, q8_0 KV, RTX 4070 on PCIe gen4 x16.
kvpipe sweep --context 512..65536/512 --depth 0,1,2 --budget 0,128 --tokens 4 --out out/ref-context --quiet
kvpipe sweep --context 4096,8192,16384,32768,65536 --depth 0..6/1 --budget 0 --tokens 4 --out out/ref-depth --quiet
kvpipe plot gain-vs-context --peak --rows out/ref-context/rows.json --out $F/ref-gain-vs-context
kvpipe plot gain-per-mib --rows out/ref-context/rows.json --out $F/ref-gain-per-mib
kvpipe plot ring-vs-context --rows out/ref-context/rows.json --budget-lines 256 --out $F/ref-ring-vs-context
kvpipe plot gain-vs-depth --rows out/ref-depth/rows.json --out $F/ref-gain-vs-depth
kvpipe plot timeline --context 16384 --depth 1 --tokens 4 --out $F/ref-timeline
kvpipe plot timeline --context 16384 --depth 1,3 --budget 0 --tokens 4 --out $F/ref-timeline-depths
kvpipe plan --budget-for-gain 0.9 > $F/ref-plan.txt

# H200 preset: llama-3.1-70b, f16 KV (80 attention layers, 4 KiB per row and layer), H200 on PCIe gen5 x16.
H="--model llama-3.1-70b --hardware h200-gen5x16 --cache-type f16"
kvpipe sweep $H --context 512..65536/512 --depth 0,1,2 --budget 0,128,256 --tokens 4 --out out/h200-context --quiet
kvpipe sweep $H --context 4096,8192,16384,32768,65536 --depth 0..6/1 --budget 0 --tokens 4 --out out/h200-depth --quiet
kvpipe plot gain-vs-context --peak --rows out/h200-context/rows.json --out $F/h200-gain-vs-context
kvpipe plot gain-per-mib --rows out/h200-context/rows.json --out $F/h200-gain-per-mib
kvpipe plot ring-vs-context --rows out/h200-context/rows.json --out $F/h200-ring-vs-context
kvpipe plot gain-vs-depth --rows out/h200-depth/rows.json --out $F/h200-gain-vs-depth
kvpipe plot timeline $H --context 16384 --depth 1 --budget 256 --tokens 4 --out $F/h200-timeline
kvpipe plan $H --context 4096,8192,16384,32768,65536,131072 --budget-for-gain 0.9 > $F/h200-plan.txt
