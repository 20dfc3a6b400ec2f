"""Launch a scenario's ranks as separate processes and assemble the run dir. No torch import here.

Run dir layout:
    manifest.json                       scenario, command, versions, expected findings
    rank{N}.pt.trace.json.gz            torch.profiler Chrome trace per rank (ProfilerStep#N markers); a scenario
                                        without torch.distributed writes tensorboard_trace_handler's default
                                        HOST_PID.TIMESTAMP.pt.trace.json(.gz) instead
    rank{N}.stdout.log / .stderr.log    per-rank output (NCCL_DEBUG=INFO on CUDA, TORCH_LOGS on compiled runs)
    torch_trace/                        TORCH_TRACE logs, gzipped after the run (set on every run; torch writes
                                        them only where something compiles)
    torch_compile_debug/                TORCH_COMPILE_DEBUG output (compiled scenarios that keep it small)
    rank{N}.nsys.sqlite                 nsys export (--nsys, where nsys is found)
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from traceql.capture.scenarios import get

REPO_ROOT = Path(__file__).resolve().parents[2]
# Where NVIDIA installs nsys when it is not on PATH (seen on the H200 machine).
NSYS_GLOBS = ("/opt/nvidia/nsight-systems/*/bin/nsys", "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
              "/usr/local/cuda/bin/nsys")
# NVLink multicast stays off on shared machines.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

ENV_KEEP = {"PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "USER"}
ENV_KEEP_PREFIXES = ("CUDA_", "NCCL_", "TORCH", "PYTORCH_", "TRITON_", "OMP_", "NVIDIA_", "GLOO_", "PYTHON")


class CaptureError(Exception):
    """The capture could not run or its run went wrong; one line saying what and what to do."""


@dataclass
class CaptureResult:
    out: Path
    manifest: dict
    exit_codes: list[int | None] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        sc = get(self.manifest["scenario"])
        failed = any(c != 0 for c in self.exit_codes)
        return failed if sc.fails else not failed


def find_nsys() -> str | None:
    found = os.environ.get("TRACEQL_NSYS") or shutil.which("nsys")
    if found:
        return found
    for pattern in NSYS_GLOBS:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


def compress_torch_trace(run: Path) -> None:
    """gzip the TORCH_TRACE logs in place (byte-identical content; they shrink ~6x and importers read gzip)."""
    for log in sorted((run / "torch_trace").glob("*.log")):
        with open(log, "rb") as src, gzip.open(log.with_name(log.name + ".gz"), "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)
        log.unlink()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nsys_version(nsys: str) -> str | None:
    try:
        p = subprocess.run([nsys, "--version"], capture_output=True, text=True, timeout=60)
        return p.stdout.strip().split()[-1] if p.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def capture(
    scenario: str,
    out: Path,
    *,
    ranks: int | None = None,
    steps: int = 3,
    backend: str = "cpu",
    nsys: bool = False,
    timeout_s: float = 300.0,
    pg_timeout_s: float | None = None,
    force: bool = False,
    command: str | None = None,
    log=print,
) -> CaptureResult:
    sc = get(scenario)
    ranks = ranks or sc.default_ranks
    if ranks < sc.min_ranks:
        raise CaptureError(f"scenario {scenario} needs at least {sc.min_ranks} ranks; pass --ranks {sc.min_ranks}")
    if not sc.distributed and ranks != 1:
        raise CaptureError(f"scenario {scenario} is a single process without torch.distributed; pass --ranks 1")
    if steps < 1:
        raise CaptureError("--steps must be at least 1")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        if not force:
            raise CaptureError(f"{out} exists and is not empty; choose a new --out or pass --force")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    nsys_bin = find_nsys() if nsys else None
    if nsys and not nsys_bin:
        log("nsys not found (PATH, TRACEQL_NSYS, /opt/nvidia): capturing without it")
    if pg_timeout_s is None:
        pg_timeout_s = 10.0 if sc.fails else 120.0  # the desync must end by its own timeout, not ours

    work = Path(tempfile.mkdtemp(prefix=f"traceql-capture-{scenario}-"))
    port = _free_port()
    # A scrubbed environment: run dirs get committed and nsys exports record the environment.
    base_env = {k: v for k, v in os.environ.items() if k in ENV_KEEP or k.startswith(ENV_KEEP_PREFIXES)}
    base_env.update(NO_MULTICAST)
    base_env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(ranks),
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    if backend == "cpu":
        # Ranks share few cores: one thread each keeps them from fighting (and the traces readable).
        base_env["OMP_NUM_THREADS"] = "1"
        base_env["CUDA_VISIBLE_DEVICES"] = ""
        if sc.fails:
            # Flight Recorder of gloo groups (torch >= 2.7 records them too); the worker dumps it after the timeout.
            base_env["TORCH_FR_BUFFER_SIZE"] = "2000"
    else:
        base_env["NCCL_DEBUG"] = "INFO"
        # ProcessGroupNCCL's Flight Recorder: the last collectives of each rank, dumped when the watchdog times out
        # (the desync scenario), one pickle per rank beside the traces.
        base_env["TORCH_NCCL_TRACE_BUFFER_SIZE"] = "2000"
        base_env["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "1"
        base_env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = str(out / "nccl_trace_rank_")
    # TORCH_TRACE on every run: compiled runs log their compiles, eager ones what torch logs structurally (little)
    base_env["TORCH_TRACE"] = str(out / "torch_trace")
    if sc.compiled:
        base_env["TORCH_LOGS"] = "recompiles,graph_breaks"
        if sc.compile_debug:
            base_env["TORCH_COMPILE_DEBUG"] = "1"
            base_env["TORCH_COMPILE_DEBUG_DIR"] = str(out)
    else:
        for k in ("TORCH_LOGS", "TORCH_COMPILE_DEBUG", "TORCH_COMPILE_DEBUG_DIR"):
            base_env.pop(k, None)

    worker = [sys.executable, "-m", "traceql.capture.worker", "--scenario", scenario, "--out", str(out),
              "--steps", str(steps), "--backend", backend, "--pg-timeout", str(pg_timeout_s)]
    procs = []
    files = []
    t0 = time.time()
    try:
        for r in range(ranks):
            env = dict(base_env, RANK=str(r), LOCAL_RANK=str(r))
            if sc.compiled:
                # A cold FX graph cache per rank: every compile is a miss that lists its key components.
                env["TORCHINDUCTOR_CACHE_DIR"] = str(work / f"inductor-rank{r}")
            cmd = worker
            if nsys_bin:
                env["TRACEQL_CAPTURE_UNDER_NSYS"] = "1"
                cmd = [nsys_bin, "profile", "-t", "cuda,nvtx", "--sample=none", "--cpuctxsw=none",
                       "--force-overwrite=true", "-o", str(work / f"rank{r}"), *worker]
            fo = open(out / f"rank{r}.stdout.log", "wb")
            fe = open(out / f"rank{r}.stderr.log", "wb")
            files += [fo, fe]
            procs.append(subprocess.Popen(cmd, env=env, stdout=fo, stderr=fe, cwd=str(work),
                                          start_new_session=True))
        codes: list[int | None] = [None] * ranks
        deadline = t0 + timeout_s
        while any(c is None for c in codes):
            for i, p in enumerate(procs):
                if codes[i] is None:
                    codes[i] = p.poll()
            if time.time() > deadline:
                for i, p in enumerate(procs):
                    if codes[i] is None:
                        log(f"rank {i} still running after {timeout_s:.0f}s: killing it")
                        try:
                            os.killpg(p.pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                        p.wait()
                        codes[i] = None if p.returncode is None else p.returncode
                break
            time.sleep(0.2)
        codes = [p.wait() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for f in files:
            f.close()
    elapsed = time.time() - t0

    nsys_ver = None
    if nsys_bin:
        nsys_ver = _nsys_version(nsys_bin)
        for r in range(ranks):
            rep = work / f"rank{r}.nsys-rep"
            if not rep.exists():
                log(f"nsys wrote no report for rank {r}")
                continue
            dst = out / f"rank{r}.nsys.sqlite"
            p = subprocess.run([nsys_bin, "export", "--type", "sqlite", "--force-overwrite=true", "-o", str(dst),
                                str(rep)], capture_output=True, text=True, timeout=300)
            if p.returncode != 0:
                log(f"nsys export failed for rank {r}: {p.stderr.strip()[-300:]}")

    compress_torch_trace(out)
    env_info = {}
    env_file = out / ".env.json"
    if env_file.exists():
        env_info = json.loads(env_file.read_text())
        env_file.unlink()
    environment = {
        "torch": env_info.get("torch"),
        "cuda": env_info.get("cuda"),
        "nccl": env_info.get("nccl"),
        "gpu": env_info.get("gpu"),
        "gpus": env_info.get("gpus", 0),
        "nsys": nsys_ver,
        "python": env_info.get("python"),
        "process_group": env_info.get("process_group"),
        "backend": backend,
    }
    if command is None:
        command = " ".join(["traceql", "capture", scenario, "--out", shlex.quote(str(out)), "--ranks", str(ranks),
                            "--steps", str(steps), "--backend", backend] + (["--nsys"] if nsys else []))
    manifest = {
        "scenario": scenario,
        "command": command,
        "clean": sc.clean,
        "environment": environment,
        "expected": sc.expected_for(ranks, backend),
        "hand_made": False,
        "ranks": ranks,
        "steps": steps,
        "exit_codes": codes,
        "duration_s": round(elapsed, 1),
        "summary": sc.summary,
    }
    if env_info.get("workload"):
        manifest["workload"] = env_info["workload"]  # what the worker measured and chose (loader scenarios)
    notes = [sc.notes] if sc.notes else []
    if nsys_bin:
        notes.append("Kineto traces hold host events only: under nsys, nsys owns CUPTI (GPU activity is in the "
                     "nsys export)")
    if nsys and not nsys_bin:
        notes.append("nsys requested but not found")
    if notes:
        manifest["notes"] = "; ".join(notes)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return CaptureResult(out, manifest, codes)
