"""`traceql serve`: a thin service over the same pipeline (docs/DESIGN "Serving uploads").

store.py  the embedded store: SQLite (tokens hashed, jobs, findings, share links) + report files under --store DIR
queue.py  the job queue: bounded concurrency, one subprocess per job (job.py), restart recovery, retention
job.py    what one job runs in its subprocess: the check of the uploaded archive, rendered as HTML, JSON, SARIF and
          the annotated trace
app.py    the Starlette app: the JSON API and two small pages, with a strict Content-Security-Policy

It adds no analysis of its own: a job's findings are those of `traceql check` on the same archive.
"""
