"""Drop chromium_event records (all but the first) from a TORCH_TRACE log, to keep fixtures small.

traceql reads only the first chromium event (to anchor the glog clock); tlparse comparisons use the untrimmed logs.
Usage: python trim_trace.py IN.log OUT.log
"""
import sys

src, dst = sys.argv[1], sys.argv[2]
seen = False
skip = False
with open(src, encoding="utf-8", errors="surrogateescape") as f, open(dst, "w", encoding="utf-8", errors="surrogateescape") as out:
    for line in f:
        if line.startswith("\t"):
            if not skip:
                out.write(line)
            continue
        skip = '] {"chromium_event": ' in line and seen
        if '] {"chromium_event": ' in line:
            seen = True
        if not skip:
            out.write(line)
