#!/usr/bin/env bash
# Regenerates fixtures/compile-* (CPU, torch 2.13.0+cpu). Usage: benchmarks/compile_programs/capture.sh OUT_ROOT
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:?out root}
export TORCH_LOGS=recompiles,graph_breaks
run() {  # name, env..., then command after --
  local name=$1; shift
  local d=$OUT/$name; rm -rf "$d"; mkdir -p "$d"
  local envs=(); while [[ $1 != -- ]]; do envs+=("$1"); shift; done; shift
  ( cd "$d" && env "${envs[@]}" TORCHINDUCTOR_CACHE_DIR="$d/.cache" CACHE_ROOT="$d/.cache" TORCH_TRACE="$d/tt" \
      "$@" > stdout.txt 2> stderr.txt ) || echo "FAILED $name"
  rm -rf "$d/.cache"; mkdir -p "$d/tt_full"
  for f in "$d"/tt/*.log; do mv "$f" "$d/tt_full/"; python "$HERE/trim_trace.py" "$d/tt_full/$(basename "$f")" "$f"; done
  gzip -9 "$d"/tt/*.log "$d"/tt_full/*.log || true
}
run compile-graph-break X=1 -- python "$HERE/graph_break_loop.py"
run compile-recompile-storm MODE=static -- python "$HERE/recompile_storm.py"
run compile-auto-dynamic MODE=auto -- python "$HERE/recompile_storm.py"
run compile-ddp-divergent DIVERGE=1 OVERLAP=0 -- torchrun --nproc_per_node 2 --master_addr 127.0.0.1 --master_port 29531 "$HERE/ddp_compile.py"
run compile-ddp-same DIVERGE=0 OVERLAP=1 -- torchrun --nproc_per_node 2 --master_addr 127.0.0.1 --master_port 29532 "$HERE/ddp_compile.py"
