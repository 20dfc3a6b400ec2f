"""`traceql check --format html`: one self-contained page; input strings are escaped; it renders in Chromium."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import polars as pl
import pytest
from _report_helpers import ANY_RUN_DIRS, HOSTILE, RUN_DIRS, checked, hostile_run, need
from conftest import FIXTURES

from traceql.report import html, html_timeline


@pytest.fixture(scope="module", params=ANY_RUN_DIRS)
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


def _scripts(page: str) -> list[tuple[dict, str]]:
    """Every <script> element: its attributes and its text."""
    return [(dict(re.findall(r"(\w[\w-]*)=([^\s>]+)", m.group(1))), m.group(2))
            for m in re.finditer(r"<script([^>]*)>(.*?)</script>", page, re.S)]


def timeline(page: str) -> dict:
    """The timeline's JSON data block, as the page's script reads it."""
    data = [t for a, t in _scripts(page) if a.get("type") == "application/json" and a.get("id") == "tl-data"]
    assert len(data) == 1
    return json.loads(data[0])


def test_page_is_self_contained(result):
    page = html.render(result)
    tags = _tags(page)
    names = {t for t, _ in tags}
    assert "iframe" not in names and "img" not in names and "object" not in names
    for tag, attrs in tags:
        if tag == "link":
            raise AssertionError(f"external resource: {attrs}")
        for k, v in attrs.items():
            if k in ("src", "srcset") or (k == "href" and tag != "a") or k.startswith("on"):
                raise AssertionError(f"<{tag} {k}={v}> loads or runs something")
            if tag == "a" and k == "href":
                assert v.startswith(("#", "https://", "http://")), v
    assert "@import" not in page and "url(" not in page
    csp = next(a for t, a in tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy")["content"]
    assert "default-src 'none'" in csp and "'unsafe-inline' 'sha" not in csp
    script_src = re.search(r"script-src ([^;]+)", csp).group(1).split()
    # one script runs, the one whose hash the policy names; the other <script> is JSON data, which never runs
    code = [t for a, t in _scripts(page) if a.get("type") != "application/json"]
    assert len(code) == 1 and len(_scripts(page)) == 2
    digest = "'sha256-" + base64.b64encode(hashlib.sha256(code[0].encode()).digest()).decode() + "'"
    assert script_src == [digest]


def test_page_has_every_section_with_run_data(result):
    page = html.render(result)
    for anchor in ("overview", "steps", "breakdown", "timeline", "waits", "kernels", "compile", "findings"):
        assert f"id={anchor}" in page
    for s in result.run.sources:
        assert s.path.name in page
    for f in result.findings:
        assert f"id='f-{f.fingerprint}'" in page
        assert html.e(f.message) in page
        assert f"class=show-tl data-fp='{f.fingerprint}'" in page
    # the timeline: one lane per (rank, device, stream) over every step, plus host lanes; every rank has lanes
    data = timeline(page)
    k = result.run.table("kernels").filter(pl.col("rank").is_not_null() & pl.col("ts").is_not_null())
    gpu = {(ln["rank"], ln["label"]) for ln in data["lanes"] if ln["side"] == "gpu"}
    assert gpu == {(r, f"gpu{d} s{s}") for r, d, s in k.select("rank", "device", "stream").unique().iter_rows()}
    assert {ln["rank"] for ln in data["lanes"]} == set(result.run.ranks)
    assert sum(len(ln["e"]) // 5 for ln in data["lanes"]) == min(data["n_events"], html_timeline.MAX_EVENTS)
    # every step of every rank is in the step selector and in the step table
    steps = result.run.table("steps").select("rank", "step").unique()
    assert {s["step"] for s in data["steps"]} == set(steps["step"].to_list())
    for s in data["steps"]:
        assert set(s["w"]) == {str(r) for r in steps.filter(pl.col("step") == s["step"])["rank"].to_list()}
    section = page[page.index("id=steps"): page.index("id=breakdown")]
    assert section.count("class=go-step") == steps["step"].n_unique()


def test_every_finding_is_placed_at_its_evidence(result):
    _check_marks(result)


def test_straggler_findings_sit_on_the_kernels_their_evidence_names():
    # h200x2-straggler: TQL202's gap names the kernels around it, TQL207 its sync call
    assert _check_marks(checked(str(FIXTURES / "h200x2-straggler"))) >= 2


def _check_marks(result) -> int:
    """Each finding has a mark on its rank, inside that rank's recorded time; where its evidence names a kernel, host op
    or runtime call the rank has, the mark sits on that, not on the step."""
    from traceql.report._align import aligner

    run = result.run
    data = timeline(html.render(result))
    marks = {m["fp"]: m for m in data["marks"]}
    al = aligner(run)
    spans, names = {}, {}
    for t in ("kernels", "host_ops", "runtime", "steps"):
        df = al(run.table(t).filter(pl.col("rank").is_not_null() & pl.col("ts").is_not_null()), ["ts", "end"])
        for r, lo, hi in df.group_by("rank").agg(pl.col("ts").min(), pl.col("end").max()).iter_rows():
            o = data["origin_ns"][str(r)]
            a, b = spans.get(r, ((lo - o) / 1000, (hi - o) / 1000))
            spans[r] = (min(a, (lo - o) / 1000), max(b, (hi - o) / 1000))
        if "name" in df.columns:
            for r, n in df.select("rank", "name").unique().iter_rows():
                names.setdefault(r, set()).add(n)
    placed = 0
    for f in result.findings:
        m = marks[f.fingerprint]
        assert m["t0"] <= m["t1"]
        if not f.ranks:
            continue
        assert m["rank"] == f.ranks[0]
        lo, hi = spans[m["rank"]]
        assert lo - 1e-3 <= m["t0"] and m["t1"] <= hi + 1e-3, (f.rule, m)
        interval = [x["table"] for x in html_timeline._INTERVALS if all(f.evidence.get(k) is not None for k in x["keys"])]
        named = [k for k in html_timeline._NAME_KEYS if isinstance(f.evidence.get(k), str) and f.evidence[k] in names.get(m["rank"], ())]
        if interval:  # a gap or a collective of a derived table, not the step around it
            assert not m["where"].startswith(("step", "whole trace")), (f.rule, m["where"])
            placed += 1
        elif named and f.evidence.get("seq") is None:
            assert m["where"].split()[0] in named, (f.rule, m["where"], named)
            placed += 1
    return placed


def test_collectives_are_linked_across_ranks(result):
    from traceql import link

    data = timeline(html.render(result))
    ci = link.ensure(result.run, "collective_instances").filter(pl.col("arrival").is_not_null() & (pl.col("n_ranks") >= 2))
    n = ci["match_id"].n_unique()
    assert len(data["links"]) == min(n, html_timeline.MAX_LINKS)
    if not data["links"]:
        return
    origin = {int(r): v for r, v in data["origin_ns"].items()}
    want = {(r, round((a - origin[r]) / 1000.0, 3)) for r, a in ci.select("rank", "arrival").iter_rows()}
    for L in data["links"]:
        assert len({p[6] for p in L["p"]}) == len(L["p"]) >= 2  # one point per rank
        for lane, arrival, wait_end, end, wait_ms, last, rank in L["p"]:
            assert data["lanes"][lane]["rank"] == rank
            assert (rank, arrival) in want
            assert wait_end >= arrival and abs(wait_ms - (wait_end - arrival) / 1000.0) < 2e-3
        assert sum(p[5] for p in L["p"]) == 1  # exactly one last arriver


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
    page = html.render(hostile)
    assert HOSTILE not in page
    assert "<img" not in page and "onerror=alert(2)>" not in page
    assert not any(t in ("img",) for t, _ in _tags(page))
    assert len(_scripts(page)) == 2  # the name did not open a script element of its own
    # in the timeline's data the name is JSON with <, > and & escaped, and reads back as the name itself
    assert "\\u003cscript\\u003ealert(1)\\u003c/script\\u003e" in page
    assert HOSTILE in timeline(page)["names"]


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


def _chromium(page: Path, tmp: Path, shot: Path | None, fragment: str = "") -> tuple[str, str]:
    args = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp / 'profile'}",
        "--enable-logging=stderr", "--v=0", "--window-size=1280,2000", "--hide-scrollbars",
    ]
    log = ""
    if shot is not None:
        log = subprocess.run([*args, f"--screenshot={shot}", page.as_uri()], capture_output=True, text=True, timeout=120).stderr
    dom = subprocess.run([*args, "--dump-dom", page.as_uri() + fragment], capture_output=True, text=True, timeout=120)
    return dom.stdout, log + dom.stderr


def _console_errors(log: str) -> list[str]:
    return [ln for ln in log.splitlines() if _CONSOLE.search(ln) and "dbus" not in ln.lower()]


def _ran(dom: str, page: str) -> None:
    """The page's script ran to its end in the browser: it marks the timeline ready and wrote one label per lane."""
    data = timeline(page)
    root = re.search(r'<div id="tl"[^>]*>', dom)
    assert root, dom[:500]
    assert 'data-ready="1"' in root.group(0), root.group(0)
    assert f'data-lanes="{len(data["lanes"])}"' in root.group(0) and f'data-links="{len(data["links"])}"' in root.group(0)
    labels = re.findall(r'<div class="tl-label[^"]*"[^>]*>(.*?)</div>', dom)
    assert len(labels) == len(data["lanes"]) > 0
    for r in data["ranks"]:
        assert any(f"rank {r} " in re.sub(r"<[^>]+>", "", x) for x in labels), r
    assert len(re.findall(r"<option", dom)) == len(data["steps"]) + 1  # every step in the selector, and "all steps"


CHROMIUM_RUNS = [FIXTURES / "h200x2-straggler", FIXTURES / "h200x2-ddp-compiled"]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium); CI decides whether to install it")
@pytest.mark.parametrize("run_dir", CHROMIUM_RUNS, ids=lambda p: p.name)
def test_two_gpu_runs_render_in_headless_chromium(run_dir, tmp_path):
    result = checked(str(run_dir))
    page = tmp_path / "report.html"
    text = html.render(result)
    page.write_text(text, encoding="utf-8")
    shot = tmp_path / "report.png"
    dom, log = _chromium(page, tmp_path, shot)
    print(f"screenshot: {shot}")
    assert shot.is_file() and shot.stat().st_size > 10_000, log[-2000:]
    assert not _console_errors(log), _console_errors(log)
    _ran(dom, text)
    assert sorted({int(x) for x in re.findall(r"<b>rank (\d+) </b>", dom)}) == result.run.ranks == [0, 1]
    data = timeline(text)
    assert data["links"], "both runs have all_reduces matched across the two ranks"
    compiled = dom[dom.index('id="compile"'): dom.index('id="findings"')]
    gb = result.run.table("compile_events").filter(pl.col("kind") == "graph_break")
    if "compiled" in run_dir.name:
        assert gb.height and "Graph breaks" in compiled
        for reason in gb["reason"].drop_nulls().unique().to_list():
            assert html.e(reason) in compiled, reason
    else:
        assert "No torch.compile record" in compiled


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium); CI decides whether to install it")
def test_a_finding_link_zooms_the_timeline_to_its_evidence(tmp_path):
    """report.html#show-FINGERPRINT runs what a click on "show on the timeline" runs: the view closes in on the
    finding's evidence (TQL202's idle gap between two kernels on rank 1), on that finding's step."""
    result = checked(str(FIXTURES / "h200x2-straggler"))
    text = html.render(result)
    page = tmp_path / "report.html"
    page.write_text(text, encoding="utf-8")
    f = next(f for f in result.findings if f.rule == "TQL202")
    mark = next(m for m in timeline(text)["marks"] if m["fp"] == f.fingerprint)
    dom, log = _chromium(page, tmp_path, None, f"#show-{f.fingerprint}")
    assert not _console_errors(log), _console_errors(log)
    a, b = map(float, re.search(r'data-view="([^"]+)"', dom).group(1).split())
    width = mark["t1"] - mark["t0"]
    assert a <= mark["t0"] and mark["t1"] <= b and b - a <= 2.2 * width + 10.01, (a, b, mark)
    assert f'data-step="{mark["step"]}"' in dom
    # without the fragment the view is the whole of the chosen step, far wider than the gap
    dom0, _ = _chromium(page, tmp_path, None)
    a0, b0 = map(float, re.search(r'data-view="([^"]+)"', dom0).group(1).split())
    assert b0 - a0 > b - a


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium); CI decides whether to install it")
def test_renders_in_headless_chromium_without_console_errors(hostile, tmp_path):
    page = tmp_path / "report.html"
    text = html.render(hostile)
    page.write_text(text, encoding="utf-8")
    shot = tmp_path / "report.png"
    dom, log = _chromium(page, tmp_path, shot)
    print(f"screenshot: {shot}")
    assert shot.is_file() and shot.stat().st_size > 10_000, log[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Where each step" in dom and "Findings" in dom, dom[:500]
    assert dom.lower().count("<script") == 2 and "<img" not in dom.lower()  # the hostile names stayed text
    assert not _console_errors(log), _console_errors(log)
    _ran(dom, text)

    # control: the same check sees a console error and a CSP refusal when a page has them
    bad = tmp_path / "bad.html"
    bad.write_text(text.replace("</body>", "<script>console.error('boom')</script></body>"), encoding="utf-8")
    _, bad_log = _chromium(bad, tmp_path, None)
    assert _console_errors(bad_log), "the console check must see the blocked script"


# --- torch.compile section ---------------------------------------------------------------------------------------


def _compile_section(result) -> str:
    page = html.render(result)
    return page[page.index("id=compile>"): page.index("id=findings>")]


def test_compile_section_lists_graph_breaks_cache_keys_and_why_ranks_differ():
    """h200x2-divergent-compile: rank 1 compiled frame 4/0 for another input shape; every FX graph key differs."""
    result = checked(str(FIXTURES / "h200x2-divergent-compile"))
    sec = _compile_section(result)
    ce = result.run.table("compile_events")
    for r in ce.filter(pl.col("kind") == "graph_break").drop_nulls("compile_id").iter_rows(named=True):
        assert html.e(r["reason"]) in sec and html.e(r["compile_id"]) in sec
        if r["user_frame"]:
            assert html.e(r["user_frame"]) in sec
    # cache keys: one row per graph of 4/0, rank 1's key highlighted in each row where it differs from rank 0's
    keys = ce.filter(pl.col("cache_key").is_not_null() & (pl.col("compile_id") == "4/0")).sort("ts")
    per_rank = {r: g["cache_key"].to_list() for (r,), g in keys.group_by("rank")}
    differ = sum(a != b for a, b in zip(per_rank[0], per_rank[1]))
    assert differ == 10
    assert sec.count("mono diverge") == differ
    for key in per_rank[1]:
        assert f"title='{key} (" in sec
    divergence = [f.message for f in result.findings if f.rule in ("TQL407", "TQL408", "TQL409")]
    assert divergence  # rank 1's graph inputs differ (TQL409)
    for note in divergence:
        assert html.e(note) in sec
    # compile time per rank, as TQL405's own numbers have it
    from traceql.rules.engine import rows
    from traceql.rules.loader import load_rules

    times = rows(result.run, next(r for r in load_rules() if r.id == "TQL405"))
    assert times is not None and times.height == 2
    for r in times.iter_rows(named=True):
        assert f"<tr><td>{r['rank']}</td><td class='num'>{r['compile_s']:.2f}</td>" in sec


def test_compile_section_shows_recompiles_with_their_guards():
    result = checked(str(FIXTURES / "compile-recompile-storm"))
    sec = _compile_section(result)
    rc = result.run.table("compile_events").filter(pl.col("kind") == "recompile")
    assert rc["compile_id"].n_unique() == 8  # read from TORCH_TRACE and from TORCH_LOGS
    for g in rc["guard"].unique().to_list():
        assert html.e(g) in sec
    assert "hit: fell back to eager" in sec
    assert "<td class=num>9</td><td class=num>8</td>" in sec  # compiles, recompiles of the frame


def test_no_compile_section_content_without_compile_records():
    sec = _compile_section(checked(str(FIXTURES / "h200x2-straggler")))
    assert "No torch.compile record" in sec and "<table" not in sec


# --- findings: severity, cost, causes before consequences ---------------------------------------------------------


def test_consequences_sit_under_their_cause_with_costs():
    import copy

    from traceql.model.result import CheckResult

    base = checked(str(FIXTURES / "h200x2-straggler"))
    findings = copy.deepcopy(base.findings)
    for f in findings:  # only the link set here: the replay's own links are tested in test_whatif
        f.caused_by = None
    cause = next(f for f in findings if f.rule == "TQL302")  # the straggler
    victim = next(f for f in findings if f.rule == "TQL101")  # rank 0's exposed communication: its waits
    cause.cost_ms_per_step, cause.cost_pct = 48.5, 41.25
    victim.caused_by = cause.fingerprint
    page = html.render(CheckResult(run=base.run, results=base.results, findings=findings))
    sec = page[page.index("id=findings>"):]
    assert "costs 48.50 ms per step, 41.2% of the step time" in sec or "costs 48.50 ms per step, 41.3% of the step time" in sec
    # nesting: the victim's div opens inside the cause's div, before it closes
    nest = _finding_parents(sec)
    assert nest[victim.fingerprint] == cause.fingerprint
    assert all(nest[f.fingerprint] is None for f in findings if f is not victim)
    # severity headers in order error, warning, info, and the victim no longer counted under its own rule
    heads = re.findall(r"<h3 class=sevhead><span class='sev (\w+)'>", sec)
    assert heads == sorted(set(heads), key=["error", "warning", "info"].index)
    assert "TQL101 exposed-communication" not in sec.split(f"id='f-{cause.fingerprint}'")[0]


def _finding_parents(section: str) -> dict:
    class P(HTMLParser):
        def __init__(self):
            super().__init__()
            self.stack, self.parent = [], {}

        def handle_starttag(self, tag, attrs):
            if tag != "div":
                return
            fid = dict(attrs).get("id", "") or ""
            fp = fid[2:] if fid.startswith("f-") else None
            if fp:
                self.parent[fp] = next((x for x in reversed(self.stack) if x), None)
            self.stack.append(fp)

        def handle_endtag(self, tag):
            if tag == "div" and self.stack:
                self.stack.pop()

    p = P()
    p.feed(section)
    return p.parent


# --- bounded on a million distinct names ---------------------------------------------------------------------------


def test_page_stays_bounded_on_a_million_distinct_kernel_names():
    """A synthetic run (in memory): 2 ranks, 10 steps, 1,000,000 kernels, every one with its own name. The page
    keeps the longest events and the names with the most time, says what it cut, and stays a few MB."""
    from traceql.model import Run
    from traceql.model.result import CheckResult
    from traceql.model.source import Source
    from traceql.model.tables import conform

    n, steps = 1_000_000, 10
    per = n // 2
    k = pl.DataFrame({"i": pl.int_range(n, eager=True)}).with_columns(
        (pl.col("i") % 2).cast(pl.Int32).alias("rank"), pl.lit(0, pl.Int32).alias("source"), pl.col("i").alias("id"),
        pl.lit(0, pl.Int32).alias("device"), (7 + pl.col("i") % 3 // 2).alias("stream"),
        pl.format("void kernel_{}<float, {}>", pl.col("i"), pl.col("i") % 97).alias("name"),
        pl.when(pl.col("i") % 10 == 0).then(pl.lit("comm")).otherwise(pl.lit("compute")).alias("kind"),
        ((pl.col("i") // 2) * 2000).alias("ts"), (1000 + pl.col("i") % 1000).alias("dur"),
    ).with_columns((pl.col("ts") + pl.col("dur")).alias("end"), ((pl.col("i") // 2) * steps // per).alias("step")).drop("i")
    span = per * 2000 // steps
    st = pl.DataFrame({"rank": [r for r in (0, 1) for _ in range(steps)], "source": [0] * 2 * steps,
                       "step": [s for _ in (0, 1) for s in range(steps)]}).with_columns(
        (pl.col("step") * span).alias("ts")).with_columns((pl.col("ts") + span).alias("end"), pl.lit(span).alias("dur"))
    run = Run(path=Path("synthetic-1M"), sources=[Source(path=Path("synthetic-1M/trace.json"), kind="kineto", ranks=[0, 1])],
              tables={"kernels": conform("kernels", k), "steps": conform("steps", st)})
    page = html.render(CheckResult(run=run, results=[]))
    assert len(page.encode()) < 4_000_000, len(page.encode())
    data = timeline(page)
    assert sum(len(ln["e"]) // 5 for ln in data["lanes"]) == html_timeline.MAX_EVENTS
    assert len(data["names"]) == html_timeline.MAX_NAMES
    assert any("distinct names not kept" in c for c in data["cut"]) and any("events not drawn" in c for c in data["cut"])
    assert "1,000,000 distinct names" in page  # the kernels section counts all of them, and lists the top ones only
    kern = page[page.index("id=kernels>"): page.index("id=compile>")]
    assert kern.count("<tr>") <= 1 + html.TOP_KERNELS + 1 + 2 * html.TOP_KERNELS_PER_RANK
    assert {len(s["w"]) for s in data["steps"]} == {2} and len(data["steps"]) == steps


def test_timeline_draws_at_most_max_ranks_and_says_so(monkeypatch):
    result = checked(str(FIXTURES / "h200x2-straggler"))
    monkeypatch.setattr(html_timeline, "MAX_RANKS", 1)
    data = html_timeline.timeline_data(result)
    assert {ln["rank"] for ln in data["lanes"]} == {0}
    assert any("1 of 2 ranks not drawn" in c for c in data["cut"])


def test_compiled_autograd_ids_sort_beside_ordinary_ones():
    """A compiled-autograd compile id ("!0/0/0", as TORCH_TRACE writes it) among ordinary ones ("4/0") once made
    the cache-key table's sort compare a string with a number: the whole HTML report failed."""
    result = checked(str(FIXTURES / "h200x2-divergent-compile"))
    ce = result.run.tables["compile_events"]
    keyed = ce.filter(pl.col("cache_key").is_not_null()).head(1)
    assert keyed.height
    result.run.tables["compile_events"] = pl.concat([ce, keyed.with_columns(pl.lit("!0/0/0").alias("compile_id"))])
    sec = _compile_section(result)
    assert "!0/0/0" in sec and "4/0" in sec
