"""The Starlette app: the JSON API scripts use, and two small pages (sign in; upload and my jobs).

Who sees what: a job is visible to the token that uploaded it, and its report to anyone holding a share link the
owner made, until the owner revokes the job's links (or the token is revoked, which takes its jobs' links with it); another token gets 404, the same answer as for a job that does not exist, so ids cannot be probed. There
is no listing of other tokens' jobs. The browser keeps the token in an HttpOnly, SameSite=Strict cookie; a request
that changes state with that cookie must come from this origin (Origin / Sec-Fetch-Site).

Pages have no script at all (the job list refreshes itself with a meta refresh while a job is pending) and escape
every input-derived string; each response carries a strict Content-Security-Policy, nosniff, no-referrer (a share
link's secret must not leak through the Referer header) and no framing. A report (input-derived HTML) is served
sandboxed with scripts forbidden: it runs in an opaque origin that can read neither the cookie nor the API.
"""

from __future__ import annotations

import html
import re
import shutil
import time

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from traceql.serve.queue import Queue
from traceql.serve.store import Store

COOKIE = "traceql_token"
APP_CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; "
           "base-uri 'none'")
# the report's own <style> and its style attributes (colour swatches) need inline styles; nothing else is allowed
REPORT_CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'none'; frame-ancestors 'none'; "
              "base-uri 'none'; sandbox")
REPORTS = {  # name in URLs -> (file in the job's run folder, media type)
    "report.html": ("report.html", "text/html; charset=utf-8"),
    "report.json": ("report.json", "application/json"),
    "report.sarif": ("report.sarif", "application/sarif+json"),
    "trace.json.gz": ("trace.json.gz", "application/gzip"),
}
_KEYS = {"report.html": "html", "report.json": "json", "report.sarif": "sarif", "trace.json.gz": "trace"}
_CHUNK = 1 << 20
_ID = re.compile(r"^[0-9a-f]{32}$")


class _TooLarge(Exception):
    pass


def create_app(store: Store, queue: Queue, max_upload_bytes: int) -> Starlette:
    def e(v) -> str:
        return html.escape("" if v is None else str(v), quote=True)

    # ------------------------------------------------------------------------------------------ who is asking
    def owner_of(request: Request) -> tuple[str | None, bool]:
        """(owner, by_cookie) of the request's token: Bearer header first, else the cookie."""
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return store.owner(auth[7:].strip()), False
        return store.owner(request.cookies.get(COOKIE)), True

    def same_origin(request: Request) -> bool:
        # Under Referrer-Policy: no-referrer a browser's form POST says "Origin: null", so the browser's
        # Sec-Fetch-Site decides then; a client that sends neither header is no browser (no cookie to ride on)
        site = request.headers.get("sec-fetch-site")
        if site is not None:
            return site in ("same-origin", "none")
        origin = request.headers.get("origin")
        return origin is None or origin == f"{request.url.scheme}://{request.url.netloc}"

    def job_json(request: Request, job: dict) -> dict:
        base = f"{request.url.scheme}://{request.url.netloc}/jobs/{job['id']}/"
        files = _files(job)
        return {
            "id": job["id"], "status": job["status"], "reason": job["reason"] or "", "name": job["name"],
            "created": job["created"], "started": job["started"], "finished": job["finished"],
            # progress: the place in the queue while queued, the seconds it has run while running
            "queued_before": store.queued_before(job) if job["status"] == "queued" else None,
            "running_s": round(time.time() - job["started"], 1) if job["status"] == "running" and job["started"] else None,
            "findings": len(store.findings(job["id"])) if job["status"] == "done" else None,
            "report": {_KEYS[k]: (base + k if k in files else None) for k in REPORTS},
        }

    def _files(job: dict) -> set[str]:
        if job["status"] != "done" or not job["report"]:
            return set()
        d = store.jobs_dir / job["id"] / job["report"]
        return {k for k, (f, _) in REPORTS.items() if (d / f).is_file()}

    def not_found() -> JSONResponse:
        return JSONResponse({"error": "no such job"}, status_code=404)

    def unauthorized() -> JSONResponse:
        return JSONResponse({"error": "missing or unknown token: send Authorization: Bearer TOKEN "
                                      "(make one with `traceql serve token create`)"}, status_code=401,
                            headers={"WWW-Authenticate": "Bearer"})

    # ------------------------------------------------------------------------------------------ uploads
    async def receive_upload(request: Request, owner: str) -> dict:
        """Stream the multipart field `file` to the job's folder; refuse past max_upload_bytes. -> the job."""
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_upload_bytes + (1 << 16):
            raise _TooLarge
        seen = 0
        receive = request.receive

        async def counted():
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > max_upload_bytes + (1 << 16):
                    raise _TooLarge
            return msg

        counted_request = Request(request.scope, counted)
        form = await counted_request.form(max_files=1, max_fields=4)
        try:
            up = form.get("file")
            if up is None or isinstance(up, str):
                raise ValueError("no file: send the archive as the multipart field `file`")
            name = _safe_name(up.filename or "upload")
            jid, d = store.new_job_dir()
            # one folder down: the job's attempts write run-N/ beside it, whatever the upload is called
            (d / "upload").mkdir(mode=0o700)
            path = d / "upload" / name
            written = 0
            with open(path, "wb") as f:
                while chunk := await up.read(_CHUNK):
                    written += len(chunk)
                    if written > max_upload_bytes:
                        f.close()
                        shutil.rmtree(d, ignore_errors=True)
                        raise _TooLarge
                    f.write(chunk)
            if written == 0:
                shutil.rmtree(d, ignore_errors=True)
                raise ValueError("the uploaded file is empty")
        finally:
            await form.close()
        store.add_job(jid, owner, up.filename or name, path)
        queue.wake()
        return store.job(jid)

    def too_large() -> JSONResponse:
        return JSONResponse({"error": f"upload larger than {max_upload_bytes >> 20} MB (traceql serve --max-upload-mb)"},
                            status_code=413)

    # ------------------------------------------------------------------------------------------ API
    async def api_create(request: Request) -> Response:
        owner, by_cookie = owner_of(request)
        if owner is None:
            return unauthorized()
        if by_cookie and not same_origin(request):
            return JSONResponse({"error": "cross-origin request refused"}, status_code=403)
        try:
            job = await receive_upload(request, owner)
        except _TooLarge:
            return too_large()
        except ValueError as ex:
            return JSONResponse({"error": str(ex)}, status_code=400)
        return JSONResponse({"id": job["id"], "status": job["status"]}, status_code=201,
                            headers={"Location": f"/api/jobs/{job['id']}"})

    async def api_list(request: Request) -> Response:
        owner, _ = owner_of(request)
        if owner is None:
            return unauthorized()
        return JSONResponse({"jobs": [job_json(request, j) for j in store.jobs_of(owner)]})

    async def api_job(request: Request) -> Response:
        owner, _ = owner_of(request)
        if owner is None:
            return unauthorized()
        job = store.job(request.path_params["id"], owner)
        return not_found() if job is None else JSONResponse(job_json(request, job))

    def own_job_to_change(request: Request) -> tuple[dict | None, Response | None]:
        """(the job, None) where the request's token owns it and may change it (a cookie only from this origin), else
        (None, the refusal: 401, 403 or 404)."""
        owner, by_cookie = owner_of(request)
        if owner is None:
            return None, unauthorized()
        if by_cookie and not same_origin(request):
            return None, JSONResponse({"error": "cross-origin request refused"}, status_code=403)
        job = store.job(request.path_params["id"], owner)
        return (job, None) if job is not None else (None, not_found())

    async def api_share(request: Request) -> Response:
        job, refused = own_job_to_change(request)
        if refused is not None:
            return refused
        url = f"{request.url.scheme}://{request.url.netloc}/s/{store.share(job['id'])}"
        return JSONResponse({"url": url, "id": job["id"]}, status_code=201)

    async def api_unshare(request: Request) -> Response:
        job, refused = own_job_to_change(request)
        if refused is not None:
            return refused
        return JSONResponse({"id": job["id"], "revoked": store.unshare(job["id"])})

    # ------------------------------------------------------------------------------------------ reports
    def report_file(job: dict | None, what: str) -> Response:
        if job is None or what not in REPORTS or what not in _files(job):
            return Response("no such report\n", status_code=404, media_type="text/plain")
        f, media = REPORTS[what]
        headers = {"Content-Security-Policy": REPORT_CSP, "Cache-Control": "private, no-store"}
        if what != "report.html":
            headers["Content-Disposition"] = f'attachment; filename="{job["id"][:12]}-{f}"'
        return FileResponse(store.jobs_dir / job["id"] / job["report"] / f, media_type=media, headers=headers)

    async def job_report(request: Request) -> Response:
        owner, _ = owner_of(request)
        job = store.job(request.path_params["id"], owner) if owner else None
        return report_file(job, request.path_params["what"])

    async def shared(request: Request) -> Response:
        return report_file(store.shared_job(request.path_params["secret"]), request.path_params.get("what", "report.html"))

    # ------------------------------------------------------------------------------------------ pages
    def page(title: str, body: str, refresh: bool = False, status: int = 200) -> HTMLResponse:
        meta = "<meta http-equiv=refresh content=2>" if refresh else ""
        return HTMLResponse(
            f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{e(title)}</title>{meta}"
            f"<link rel=stylesheet href=/static/app.css></head><body><h1>traceql</h1>{body}</body></html>",
            status_code=status, headers={"Cache-Control": "no-store"})

    async def index(request: Request) -> Response:
        owner, _ = owner_of(request)
        if owner is None:
            return page("traceql: sign in", (
                "<p>Paste the token made by <code>traceql serve token create</code>. It is kept in a cookie of this "
                "browser only.</p><form method=post action=/login><input type=password name=token id=token "
                "autocomplete=off required size=50> <button type=submit id=signin>Sign in</button></form>"))
        jobs = store.jobs_of(owner)
        shared_n = store.share_counts(owner)
        rows = []
        for j in jobs:
            files = _files(j)
            links = " ".join(f"<a href='/jobs/{e(j['id'])}/{k}'>{_KEYS[k]}</a>" for k in REPORTS if k in files)
            share = (f"<form method=post action='/jobs/{e(j['id'])}/share' class=inline><button type=submit "
                     f"class=share>share</button></form>" if files else "")
            if shared_n.get(j["id"]):
                share += (f" <form method=post action='/jobs/{e(j['id'])}/unshare' class=inline><button type=submit "
                          f"class=unshare title='revoke every share link of this job'>unshare "
                          f"({shared_n[j['id']]})</button></form>")
            n = len(store.findings(j["id"])) if j["status"] == "done" else ""
            rows.append(f"<tr class='job {e(j['status'])}' data-id='{e(j['id'])}'><td>{e(j['name'])}</td>"
                        f"<td>{e(time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(j['created'])))}</td>"
                        f"<td class=status>{e(j['status'])}</td><td>{e(n)}</td><td>{e(j['reason'])}</td>"
                        f"<td>{links}</td><td>{share}</td></tr>")
        table = ("<table id=jobs><tr><th>upload</th><th>created (UTC)</th><th>status</th><th>findings</th><th>reason</th>"
                 "<th>report</th><th></th></tr>" + "".join(rows) + "</table>") if rows else "<p id=nojobs>No jobs yet.</p>"
        body = ("<form method=post action=/upload enctype=multipart/form-data id=upload><p>Upload a run dir archive "
                "(.tar, .tar.gz, .tar.zst, .zip): <input type=file name=file id=file required> "
                "<button type=submit id=send>Check it</button></p></form>"
                f"<h2>My jobs</h2>{table}<form method=post action=/logout><button type=submit>Sign out</button></form>")
        pending = any(j["status"] in ("queued", "running") for j in jobs)
        return page("traceql: my jobs", body, refresh=pending)

    async def login(request: Request) -> Response:
        if not same_origin(request):
            return page("traceql", "<p>Cross-origin sign-in refused.</p>", status=403)
        form = await request.form(max_files=0, max_fields=2)
        token = str(form.get("token") or "").strip()
        if store.owner(token) is None:
            return page("traceql: sign in", "<p id=error>Unknown token.</p><p><a href=/>Try again</a></p>", status=401)
        r = RedirectResponse("/", status_code=303)
        r.set_cookie(COOKIE, token, httponly=True, samesite="strict", secure=request.url.scheme == "https",
                     max_age=30 * 86400)
        return r

    async def logout(request: Request) -> Response:
        r = RedirectResponse("/", status_code=303)
        r.delete_cookie(COOKIE)
        return r

    async def upload_page(request: Request) -> Response:
        owner, _ = owner_of(request)
        if owner is None or not same_origin(request):
            return RedirectResponse("/", status_code=303)
        try:
            await receive_upload(request, owner)
        except _TooLarge:
            return page("traceql", f"<p id=error>Upload larger than {max_upload_bytes >> 20} MB.</p>", status=413)
        except ValueError as ex:
            return page("traceql", f"<p id=error>{e(ex)}</p><p><a href=/>Back</a></p>", status=400)
        return RedirectResponse("/", status_code=303)

    async def share_page(request: Request) -> Response:
        owner, _ = owner_of(request)
        job = store.job(request.path_params["id"], owner) if owner and same_origin(request) else None
        if job is None:
            return page("traceql", "<p>No such job.</p>", status=404)
        url = f"{request.url.scheme}://{request.url.netloc}/s/{store.share(job['id'])}"
        return page("traceql: share link", (
            f"<p>Anyone with this link can read the report of <b>{e(job['name'])}</b> (and only that report):</p>"
            f"<p><a id=share-url href='{e(url)}'>{e(url)}</a></p><p><a href=/>Back to my jobs</a></p>"))

    async def unshare_page(request: Request) -> Response:
        owner, _ = owner_of(request)
        job = store.job(request.path_params["id"], owner) if owner and same_origin(request) else None
        if job is None:
            return page("traceql", "<p>No such job.</p>", status=404)
        store.unshare(job["id"])
        return RedirectResponse("/", status_code=303)

    async def css(request: Request) -> Response:
        return Response(_CSS, media_type="text/css")

    routes = [
        Route("/", index), Route("/login", login, methods=["POST"]), Route("/logout", logout, methods=["POST"]),
        Route("/upload", upload_page, methods=["POST"]), Route("/jobs/{id}/share", share_page, methods=["POST"]),
        Route("/jobs/{id}/unshare", unshare_page, methods=["POST"]),
        Route("/static/app.css", css),
        Route("/api/jobs", api_create, methods=["POST"]), Route("/api/jobs", api_list, methods=["GET"]),
        Route("/api/jobs/{id}", api_job), Route("/api/jobs/{id}/share", api_share, methods=["POST"]),
        Route("/api/jobs/{id}/share", api_unshare, methods=["DELETE"]),
        Route("/jobs/{id}/{what}", job_report), Route("/s/{secret}", shared), Route("/s/{secret}/{what}", shared),
    ]
    app = Starlette(routes=routes, middleware=[])
    app.add_middleware(_Headers)
    return app


class _Headers:
    """Security headers on every response; a route's own Content-Security-Policy (reports) is kept."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(msg):
            if msg["type"] == "http.response.start":
                headers = list(msg.get("headers", []))
                names = {k.lower() for k, _ in headers}
                extra = {b"x-content-type-options": b"nosniff", b"referrer-policy": b"no-referrer",
                         b"x-frame-options": b"DENY", b"content-security-policy": APP_CSP.encode(),
                         b"cross-origin-opener-policy": b"same-origin"}
                headers += [(k, v) for k, v in extra.items() if k not in names]
                msg = {**msg, "headers": headers}
            await send(msg)

        await self.app(scope, receive, send_with_headers)


def _safe_name(name: str) -> str:
    """The upload's base name as a file name of ours: letters, digits, . _ - only, no leading dot, at most 120."""
    base = re.split(r"[\\/]", name)[-1]
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", base).lstrip(".")[-120:]
    return safe or "upload"


_CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse}
td,th{padding:.3em .6em;border-bottom:1px solid #ddd;text-align:left}.failed .status{color:#b00}
.done .status{color:#070}.inline{display:inline}code{background:#f3f3f3;padding:0 .2em}
"""
