"""`traceql check --format html`: one self-contained page; input strings are escaped; it renders in Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import polars as pl
import pytest
from _report_helpers import HOSTILE, RUN_DIRS, checked, hostile_run, need

from traceql.report import html


@pytest.fixture(scope="module", params=RUN_DIRS)
def result(request):
    """The committed sample run (always) and the corpus's trace_filter (where present)."""
    return checked(str(need(request.param)))


@pytest.fixture(scope="module", params=RUN_DIRS)
def hostile(request, tmp_path_factory):
    from traceql import pipeline

    run_dir = hostile_run(tmp_path_factory.mktemp("hostile") / "run", need(request.param))
    return pipeline.check(run_dir, use_cache=False)


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def _tags(page: str) -> list[tuple[str, dict]]:
    p = _Tags()
    p.feed(page)
    return p.tags


def test_page_is_self_contained(result):
    page = html.render(result)
    tags = _tags(page)
    names = {t for t, _ in tags}
    assert "script" not in names and "iframe" not in names and "img" not in names
    for tag, attrs in tags:
        if tag == "link":
            raise AssertionError(f"external resource: {attrs}")
        for k, v in attrs.items():
            if k in ("src", "srcset") or (k == "href" and tag != "a"):
                raise AssertionError(f"<{tag} {k}={v}> loads something")
            if tag == "a" and k == "href":
                assert v.startswith(("#", "https://", "http://")), v
    assert "@import" not in page and "url(" not in page
    csp = next(a for t, a in tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy")
    assert "default-src 'none'" in csp["content"] and "script-src" not in csp["content"]


def test_page_has_every_section_with_run_data(result):
    page = html.render(result)
    for anchor in ("overview", "breakdown", "timeline", "waits", "findings"):
        assert f"id={anchor}" in page
    for s in result.run.sources:
        assert s.path.name in page
    for f in result.findings:
        assert f"id='f-{f.fingerprint}'" in page
        assert html.e(f.message) in page
    # one timeline block per rank, one lane per (device, stream) of the drawn step
    step = html.choose_step(result)
    k = result.run.table("kernels").filter(pl.col("step") == step)
    lanes = k.select("rank", "device", "stream").unique().height
    section = page[page.index("id=timeline"): page.index("id=waits")]
    assert section.count("class=ln>gpu") == lanes
    for r in result.run.ranks:
        assert f"class=rk>rank {r}</text>" in section


def test_breakdown_parts_add_up_to_step_time(result):
    bd = html.breakdown_rows(result.run)
    steps = result.run.table("steps").select("rank", "step").unique()
    assert bd.height == steps.height > 0  # one row per profiler step of each rank
    parts = sum(bd[p] for p, _, _ in html.PARTS)
    diff = (parts - bd["step_ms"]).abs()
    # the GPU span can run past the host step window (kernels launched late in the step); within 2%
    assert (diff <= bd["step_ms"] * 0.02 + 0.01).all(), bd


def test_chosen_step_is_the_one_findings_name(result):
    step = html.choose_step(result)
    named = [f for f in result.findings if f.step == step or step in (f.evidence.get("steps") or [])]
    assert named
    assert step in result.run.table("steps")["step"].to_list()


def test_hostile_kernel_names_are_escaped(hostile):
    kernels = hostile.run.table("kernels")
    assert kernels.filter(pl.col("name") == HOSTILE).height > 0, "the hostile name must reach the kernels table"
    page = html.render(hostile, step=int(kernels.filter(pl.col("name") == HOSTILE)["step"].drop_nulls()[0]))
    assert HOSTILE not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<img" not in page and "onerror=alert" not in page.replace("onerror=alert(2)&gt;", "")
    assert not any(t in ("script", "img") for t, _ in _tags(page))


def test_heatmap_degrades_when_collective_instances_missing(result, monkeypatch):
    from traceql import link

    reg = dict(link.derived_tables())
    reg.pop("collective_instances", None)
    monkeypatch.setattr(link, "derived_tables", lambda: reg)
    run = result.run
    saved = run.tables.pop("collective_instances", None)
    try:
        page = html.render(result)
    finally:
        if saved is not None:
            run.tables["collective_instances"] = saved
    section = page[page.index("id=waits"): page.index("id=findings")]
    assert "Not available" in section and "<rect" not in section


def test_heatmap_from_collective_instances(result):
    from traceql import link

    if "collective_instances" not in link.derived_tables():
        pytest.skip("collective_instances is not registered in this tree")
    ci = link.ensure(result.run, "collective_instances").filter(pl.col("wait_ms").is_not_null())
    page = html.render(result)
    section = page[page.index("id=waits"): page.index("id=findings")]
    n = ci.filter(pl.col("match_id").is_in(ci["match_id"].unique().sort().head(html.HEAT_MAX_COLS).to_list())).height
    if ci["match_id"].n_unique() <= html.HEAT_MAX_COLS:
        assert section.count("<rect") == ci.height
    else:
        assert section.count("<rect") == n


# --- real headless Chromium --------------------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
_CONSOLE = re.compile(r"CONSOLE|Uncaught|Refused to|Content Security Policy|Failed to load|ERR_", re.IGNORECASE)


def _chromium(page: Path, tmp: Path, shot: Path | None) -> tuple[str, str]:
    args = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp / 'profile'}",
        "--enable-logging=stderr", "--v=0", "--window-size=1280,2000", "--hide-scrollbars",
    ]
    log = ""
    if shot is not None:
        log = subprocess.run([*args, f"--screenshot={shot}", page.as_uri()], capture_output=True, text=True, timeout=120).stderr
    dom = subprocess.run([*args, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    return dom.stdout, log + dom.stderr


def _console_errors(log: str) -> list[str]:
    return [ln for ln in log.splitlines() if _CONSOLE.search(ln) and "dbus" not in ln.lower()]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium); CI decides whether to install it")
def test_renders_in_headless_chromium_without_console_errors(hostile, tmp_path):
    page = tmp_path / "report.html"
    page.write_text(html.render(hostile), encoding="utf-8")
    shot = tmp_path / "report.png"
    dom, log = _chromium(page, tmp_path, shot)
    print(f"screenshot: {shot}")
    assert shot.is_file() and shot.stat().st_size > 10_000, log[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Where each step" in dom and "Findings" in dom, dom[:500]
    assert "<script" not in dom.lower()
    assert dom.count("<rect") > 100  # the timeline and breakdown drew
    assert not _console_errors(log), _console_errors(log)

    # control: the same check sees a console error and a CSP refusal when a page has them
    bad = tmp_path / "bad.html"
    bad.write_text(page.read_text(encoding="utf-8").replace("</body>", "<script>console.error('boom')</script></body>"), encoding="utf-8")
    _, bad_log = _chromium(bad, tmp_path, None)
    assert _console_errors(bad_log), "the console check must see the blocked script"
