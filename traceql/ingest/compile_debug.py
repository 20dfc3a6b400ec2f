"""TORCH_COMPILE_DEBUG output folders (run_<time>-pid_<pid>/ with debug.log). (stub: being written)"""

from __future__ import annotations

from pathlib import Path

KIND = "compile_debug"
SUPPORTED = False
FOLDER = True  # discovery hands this module directories, and does not descend into ones it takes


def sniff(path: Path, head: bytes) -> bool:
    return path.is_dir() and path.name.startswith("run_") and "-pid_" in path.name
