"""Copy one capture (capture.sh output) into fixtures/NAME: trimmed TORCH_TRACE logs, TORCH_LOGS stderr, a gzipped
Kineto trace where there is one, and manifest.json. Usage: python make_fixture.py CAPTURE_DIR FIXTURE_DIR MANIFEST_JSON"""
import gzip
import json
import shutil
import sys
from pathlib import Path

cap, dst, manifest = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
if dst.exists():
    shutil.rmtree(dst)
(dst / "tt").mkdir(parents=True)
for f in sorted((cap / "tt").glob("*.log.gz")):
    shutil.copy(f, dst / "tt" / f.name)
if (cap / "stderr.txt").stat().st_size:
    shutil.copy(cap / "stderr.txt", dst / "stderr.txt")
k = cap / "kineto_trace.json"
if k.exists():
    with open(k, "rb") as fi, gzip.open(dst / "kineto_trace.json.gz", "wb", compresslevel=9) as fo:
        shutil.copyfileobj(fi, fo)
(dst / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
print(dst, sum(p.stat().st_size for p in dst.rglob("*") if p.is_file()))
