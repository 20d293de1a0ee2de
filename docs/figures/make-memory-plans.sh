#!/usr/bin/env bash
# Regenerate the worked memory plans of docs/capacity-planning.md ("Your model on your card"), one per card preset.
# Each writes its table to docs/figures/memplan-*.txt and its plot to docs/figures/memplan-*.png/.svg.
# --host-mem 64 plans for a 64 GiB host (the default is the machine running the command).
set -euo pipefail
cd "$(dirname "$0")/../.."
F=docs/figures
C=4096,16384,32768,65536,98304,131072,196608,262144
kvpipe plan -m llama-3.1-8b  --hardware rtx4070-gen4x16 -d $C --max-depth 2 --host-mem 64 --plot $F/memplan-rtx4070-8b  > $F/memplan-rtx4070-8b.txt
kvpipe plan -m llama-3.1-8b  --hardware rtx3060-gen3x4  -d $C --max-depth 2 --host-mem 64 --plot $F/memplan-rtx3060-8b  > $F/memplan-rtx3060-8b.txt
kvpipe plan -m llama-3.1-70b --hardware rtx4070-gen4x16 -d 4096,16384,32768,65536 --max-depth 2 --host-mem 64 --plot $F/memplan-rtx4070-70b > $F/memplan-rtx4070-70b.txt
kvpipe plan -m llama-3.1-70b --hardware h200-gen5x16    -d 32768,131072,262144,524288,1048576 --max-depth 2 --host-mem 512 --plot $F/memplan-h200-70b > $F/memplan-h200-70b.txt
kvpipe plan -m qwen3.8-27b   --hardware gh200-c2c       -d 65536,262144,1048576,2097152 --max-depth 2 --host-mem 480 --plot $F/memplan-gh200-27b > $F/memplan-gh200-27b.txt
