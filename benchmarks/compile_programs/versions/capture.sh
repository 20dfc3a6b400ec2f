#!/usr/bin/env bash
# Regenerates fixtures/compile-torch*-probe and the multi-rank compile fixtures (CPU only).
# Older torch: a venv per version, e.g.
#   python3 -m venv /work/venvs/compile-torch231 && /work/venvs/compile-torch231/bin/pip install torch==2.3.1 "numpy<2"
# (PyPI's CUDA wheels: their nvidia-* libraries load without a GPU, torch.cuda.is_available() is False).
# Usage: capture.sh OUT_ROOT [VENV_2_13 [VENV_2_5 [VENV_2_3 [VENV_2_1]]]]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
OUT=${1:?out root}
run() {  # name venv env... -- command
  local name=$1 venv=$2; shift 2
  local d=$OUT/$name; rm -rf "$d"; mkdir -p "$d"
  local envs=(); while [[ $1 != -- ]]; do envs+=("$1"); shift; done; shift
  ( cd "$d" && env "${envs[@]}" PATH="$venv/bin:$PATH" CACHE_ROOT="$d/.cache" TORCHINDUCTOR_CACHE_DIR="$d/.cache" \
      TORCH_TRACE="$d/tt" TORCH_LOGS=recompiles,graph_breaks "$@" > stdout.txt 2> stderr.txt ) || echo "FAILED $name"
}
V213=${2:-$REPO/.venv}
run probe-2.13 "$V213" -- python "$HERE/probe.py"
[[ -n ${3:-} ]] && run probe-2.5 "$3" -- python "$HERE/probe.py"
[[ -n ${4:-} ]] && run probe-2.3 "$4" -- python "$HERE/probe.py"
[[ -n ${5:-} ]] && run probe-2.1 "$5" -- python "$HERE/probe.py"
D=$HERE/../divergent_ranks.py
run schedule5 "$V213" MODE=schedule ODD=2 -- torchrun --nproc_per_node 5 --master_addr 127.0.0.1 --master_port 29613 "$D"
run graph5 "$V213" MODE=graph ODD=2 -- torchrun --nproc_per_node 5 --master_addr 127.0.0.1 --master_port 29614 "$D"
# cache pattern: the same job twice, rank 2's cache dir wiped in between; the second run's logs are the fixture
c=$OUT/cache3; rm -rf "$c" && mkdir -p "$c"
for i in 1 2; do
  rm -rf "$c/tt"; [[ $i == 2 ]] && rm -rf "$c/.cache/rank2"
  ( cd "$c" && MODE=same ODD=1 CACHE_ROOT="$c/.cache" TORCH_TRACE="$c/tt" TORCH_LOGS=recompiles,graph_breaks \
      "$V213/bin/torchrun" --nproc_per_node 3 --master_addr 127.0.0.1 --master_port 2962$i "$D" > stdout.txt 2> stderr.txt )
done
echo "then: python $HERE/make_fixture.py CAPTURE_DIR fixtures/NAME MANIFEST_JSON (see each fixture's manifest.json)"
