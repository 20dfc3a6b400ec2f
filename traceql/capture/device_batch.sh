#!/usr/bin/env bash
# Record the h200 plan (traceql/capture/batch.py) in ONE device-machine call and pack the run dirs into $OUT.
#   run(command="bash traceql/capture/device_batch.sh", carry=[".deb"], timeout_s=600)
# .deb holds libdw1 and libelf1 (`apt-get download libdw1 libelf1`), which nsys needs there.
set -u
OUT=${OUT:-/tmp/traceql-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if ls .deb/*.deb >/dev/null 2>&1; then
  mkdir -p /tmp/dl && for f in .deb/*.deb; do dpkg -x "$f" /tmp/dl; done
  export LD_LIBRARY_PATH=/tmp/dl/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
fi
nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
PYTHONPATH=. python3 -m traceql.capture.batch --plan "${PLAN:-h200}" --out /tmp/traceql-runs --pack "$OUT" \
  --deadline "${DEADLINE:-420}" --timeout 240 "$@" 2>&1 | tee "$OUT/batch.log"
cp /tmp/traceql-runs/batch.json "$OUT/" 2>/dev/null
ls -la "$OUT"
