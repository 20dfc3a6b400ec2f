"""`traceql serve` and `traceql serve token create|revoke`: argument handling only; the service is traceql.serve."""

from __future__ import annotations

from pathlib import Path

import click

from traceql.cli._common import _fail

_STORE = click.option("--store", "store_dir", type=click.Path(path_type=Path, file_okay=False),
                      help="Store folder (SQLite + reports) [default: $XDG_DATA_HOME/traceql or ~/.local/share/traceql].")


def _open(store_dir: Path | None):
    from traceql.serve.store import Store, default_dir

    try:
        return Store(store_dir or default_dir())
    except OSError as e:
        _fail(f"{store_dir or default_dir()}: cannot open the store: {e.strerror or e}; pass --store DIR")


@click.group(invoke_without_command=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every interface).")
@click.option("--port", default=8321, show_default=True, type=click.IntRange(1, 65535))
@_STORE
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 256), help="Jobs checked at once.")
@click.option("--max-upload-mb", default=4096, show_default=True, type=click.IntRange(1), help="Largest upload accepted.")
@click.option("--job-timeout", default=1800.0, show_default=True, type=click.FloatRange(0), help="Seconds a job may run (0: no limit).")
@click.option("--keep-days", default=30.0, show_default=True, type=click.FloatRange(0), help="Finished jobs older than this are removed (0: kept).")
@click.option("--keep-jobs", default=1000, show_default=True, type=click.IntRange(0), help="At most this many finished jobs are kept (0: no limit).")
@click.pass_context
def serve(ctx, host, port, store_dir, workers, max_upload_mb, job_timeout, keep_days, keep_jobs):
    """Serve uploads: POST a run dir archive, get the HTML, JSON and SARIF reports and the annotated trace.

    Make a token first with `traceql serve token create`; the README's "Upload service" section has the API.
    """
    if ctx.invoked_subcommand is not None:
        return
    try:
        import uvicorn

        from traceql.serve.app import create_app
    except ImportError as e:
        _fail(f"traceql serve needs the serve extra ({e.name} is missing): pip install 'traceql[serve]' "
              "(from a checkout: pip install -e '.[serve]')")
        return
    from traceql.serve.queue import Queue

    store = _open(store_dir)
    queue = Queue(store, workers=workers, job_timeout_s=job_timeout or None, keep_days=keep_days or None,
                  keep_jobs=keep_jobs or None)
    requeued, failed = queue.start()
    click.echo(f"traceql serve: http://{host}:{port}/ (store {store.root}; {workers} worker(s); "
               f"{requeued} job(s) resumed, {failed} failed after restarts)", err=True)
    try:
        import tempfile

        # Starlette spools uploads above 1 MB to a temporary file first: into the store, not a small or RAM-backed /tmp
        tempfile.tempdir = str(store.root / "tmp")
        uvicorn.Server(uvicorn.Config(create_app(store, queue, max_upload_mb << 20), host=host, port=port,
                                      log_level="warning", lifespan="off")).run()
    finally:
        queue.stop()


@serve.group()
def token():
    """Tokens: each upload is owned by the token that sent it."""


@token.command("create")
@_STORE
def token_create(store_dir):
    """Make a new token; it is printed once, as the last word (the store keeps only its hash)."""
    store = _open(store_dir)
    click.echo(f"new token for {store.root}: {store.create_token()}")


@token.command("revoke")
@click.argument("token_value", metavar="TOKEN", default="-")
@_STORE
def token_revoke(token_value, store_dir):
    """Revoke TOKEN (or one read from stdin, the default: it stays out of shell history). It opens nothing from then
    on, and the share links made for its jobs stop working too; its jobs stay until --keep-days removes them."""
    if token_value == "-":
        token_value = click.get_text_stream("stdin").readline()
    token_value = token_value.strip()
    if not token_value:
        _fail("no token given: pass it as TOKEN or on stdin")
    store = _open(store_dir)
    n = store.revoke_token(token_value)
    if n is None:
        _fail(f"{store.root}: no such token (already revoked, or made for another --store)")
    click.echo(f"revoked the token and {n} share link(s) of its jobs in {store.root}")
