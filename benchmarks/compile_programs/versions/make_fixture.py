"""Copy one capture (TORCH_TRACE logs under tt/, TORCH_LOGS in stderr) into fixtures/NAME, keeping only the records
traceql reads, so that a fixture stays a few KB: str, dynamo_start, compilation_metrics, the first chromium_event
(the clock anchor), dynamo_output_graph, inductor_post_grad_graph, the DDP split records, and the artifacts
dynamo_graph_break_reason, recompile_reasons, inductor_post_grad_graph and the FX/AOT cache ones
(hit/miss/bypass; fx_graph_cache_hash in torch 2.5).
Everything else (guards, describe_*, output code, provenance, ...) is dropped; what is kept is byte for byte as
captured. Usage: python make_fixture.py CAPTURE_DIR FIXTURE_DIR MANIFEST_JSON [STDERR_NAME]
"""
import gzip
import json
import re
import shutil
import sys
from pathlib import Path

KEEP = {"str", "dynamo_start", "compilation_metrics", "bwd_compilation_metrics", "dynamo_output_graph",
        "inductor_post_grad_graph", "optimize_ddp_split_graph", "optimize_ddp_split_child"}
KEEP_ARTIFACTS = {"dynamo_graph_break_reason", "recompile_reasons", "inductor_post_grad_graph", "fx_graph_cache_hit",
                  "fx_graph_cache_miss", "fx_graph_cache_bypass", "aotautograd_cache_hit", "aotautograd_cache_miss",
                  "aotautograd_cache_bypass", "inductor_collective_schedule", "fx_graph_cache_hash"}
HEAD = re.compile(r"^(?:\[rank\d+\]:)?[VIWEC]\d{4} [^\]]*\] (\{.*)$")


def trim(src: Path, dst: Path) -> None:
    out, keep, clock = [], False, False
    opener = gzip.open if src.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(src, "rt", encoding="utf-8", errors="surrogateescape", newline="\n") as f:
        for line in f:
            if line.startswith("\t"):
                if keep:
                    out.append(line)
                continue
            m = HEAD.match(line.rstrip("\n"))
            env = json.loads(m.group(1)) if m else {}
            kind = next((k for k in env if k not in ("rank", "frame_id", "frame_compile_id", "attempt",
                                                     "compiled_autograd_id", "has_payload", "stack")), None)
            keep = (kind in KEEP or (kind == "artifact" and env["artifact"].get("name") in KEEP_ARTIFACTS)
                    or (kind == "chromium_event" and not clock))
            clock = clock or kind == "chromium_event"
            if keep:
                out.append(line)
    with gzip.open(dst, "wt", encoding="utf-8", errors="surrogateescape", newline="\n", compresslevel=9) as g:
        g.write("".join(out))


cap, dst, manifest = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
stderr_name = sys.argv[4] if len(sys.argv) > 4 else "stderr.txt"
if dst.exists():
    shutil.rmtree(dst)
dst.mkdir(parents=True)
logs = sorted((cap / "tt").glob("*.log")) if (cap / "tt").is_dir() else []
if logs:
    (dst / "tt").mkdir()
for f in logs:
    trim(f, dst / "tt" / (f.name + ".gz"))
err = cap / stderr_name
if err.exists() and err.stat().st_size:
    shutil.copy(err, dst / "stderr.txt")
(dst / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
print(dst, sum(p.stat().st_size for p in dst.rglob("*") if p.is_file()))
