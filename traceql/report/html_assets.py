"""The HTML report's stylesheet and its one script, inline. The page's Content-Security-Policy allows exactly this
script by its SHA-256 (SCRIPT_CSP): nothing else runs, nothing is fetched, and input-derived text reaches the page only
through html.escape or as JSON data that the script puts in the DOM with textContent, never as markup."""

from __future__ import annotations

import base64
import hashlib
import html as _html


def e(v) -> str:
    """v as HTML text or attribute value (quotes escaped too): every input-derived string goes through here."""
    return _html.escape("" if v is None else str(v), quote=True)


def cut(v, n: int = 160) -> str:
    """v as text of at most n characters (an ellipsis says it was cut): kernel names can be kilobytes of templates."""
    s = "" if v is None else str(v)
    return s if len(s) <= n else s[: n - 1] + "\u2026"


CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1400px}
nav{position:sticky;top:0;background:#fff;padding:4px 0;border-bottom:1px solid #eee;z-index:5}
h1{font-size:22px}h1 .dim{font-weight:normal;color:#666;font-size:14px}h2{margin-top:32px;border-bottom:1px solid #ddd}
h3{margin:18px 0 6px 0;font-size:16px}
table{border-collapse:collapse;margin:8px 0}td,th{padding:3px 8px;text-align:left;vertical-align:top}
table.grid td,table.grid th{border-bottom:1px solid #eee}table.grid th{background:#f6f6f6}
table.grid td.num,table.grid th.num{text-align:right;font-variant-numeric:tabular-nums}
table.kv th{color:#555;font-weight:600;padding-right:16px}
td.hot{background:#fde2e1}td.cold{background:#e3f1e3}td.diverge{background:#fde2e1;font-weight:600}
.sev{display:inline-block;padding:0 6px;border-radius:3px;color:#fff;font-size:12px}
.sev.error{background:#c0392b}.sev.warning{background:#d68910}.sev.info{background:#2e86c1}
.st-error td{color:#c0392b}.st-skipped td{color:#888}.st-partial td{color:#b9770e}
.note{color:#555}.ok{color:#1e8449}.warn{color:#b9770e}.notes{color:#555}.cut{color:#a04000}
.sw{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}
.scroll{overflow-x:auto}svg text{font:11px system-ui,sans-serif;fill:#333}svg text.rk{font-weight:600}
td.bar{padding:2px 8px}code,.mono{font:12px ui-monospace,SFMono-Regular,Menlo,monospace;word-break:break-all}.pre{white-space:pre-wrap}
.rule{margin:16px 0;padding:8px 12px;border-left:4px solid #ddd}.rule.error{border-color:#c0392b}
.rule.warning{border-color:#d68910}.rule.info{border-color:#2e86c1}
.finding{margin:8px 0 8px 8px;padding:6px 10px;background:#fafafa}.finding .finding{background:#f2f2f2;margin-left:24px}
.finding:target{outline:2px solid #d68910}.msg{margin:0 0 4px 0}.meta{color:#666;font-size:12px;margin:2px 0}
.cost{font-weight:600;color:#7b241c}.caused{color:#555;font-size:12px;margin:6px 0 0 24px}
footer{margin-top:40px;color:#888;font-size:12px}
.tl-bar{margin:6px 0;display:flex;gap:10px;align-items:center;flex-wrap:wrap}.tl-bar button{padding:1px 8px}
.tl{position:relative;border:1px solid #ddd;background:#fff;user-select:none}
.tl canvas{display:block;cursor:grab}.tl canvas:focus{outline:2px solid #9cc3e6}
.tl-label{position:absolute;left:4px;width:144px;font-size:10px;line-height:14px;height:14px;color:#555;overflow:hidden;
white-space:nowrap;text-overflow:ellipsis;pointer-events:none}.tl-label.first b{color:#222}
.tip{position:absolute;z-index:4;max-width:520px;background:#222;color:#fff;padding:4px 8px;border-radius:3px;font-size:12px;
pointer-events:none;white-space:pre-wrap;word-break:break-all}
a.show-tl{font-size:12px}.ev{display:flex;flex-wrap:wrap;gap:2px 18px;font-size:12px;margin:4px 0}.ev b{color:#555;font-weight:600}
.ev span{max-width:100%;overflow-wrap:anywhere}
"""

# The timeline: lanes of events per rank on a canvas, zoom (wheel, +/-, w/s), pan (drag, a/d), a step selector,
# collectives linked across ranks, finding marks; finding links and step links in the tables zoom it.
SCRIPT = r"""(function () {
"use strict";
var dataEl = document.getElementById("tl-data"), root = document.getElementById("tl");
if (!dataEl || !root) return;
var D = JSON.parse(dataEl.textContent);
var cv = document.getElementById("tl-canvas"), tip = document.getElementById("tl-tip");
var sel = document.getElementById("tl-step"), rangeEl = document.getElementById("tl-range");
var linksBox = document.getElementById("tl-links");
var COLORS = {compute: "#4e79a7", comm: "#e15759", memcpy: "#f28e2b", memset: "#edc948", host: "#a8a8a8", other: "#777"};
var SEV = {error: "#c0392b", warning: "#d68910", info: "#2e86c1"};
var LW = 152, LH = 14, GAP = 3, RGAP = 12, TOP = 16, AXIS = 24, F = 5;
var lanes = D.lanes, y = TOP, prev = null, firstLane = {};
lanes.forEach(function (ln, i) {
  if (prev !== null && ln.rank !== prev) y += RGAP;
  ln.y = y; y += LH + GAP;
  if (!(ln.rank in firstLane)) firstLane[ln.rank] = i;
  var lab = document.createElement("div");
  lab.className = "tl-label" + (prev !== ln.rank ? " first" : "");
  lab.style.top = ln.y + "px";
  if (prev !== ln.rank) { var b = document.createElement("b"); b.textContent = "rank " + ln.rank + " "; lab.appendChild(b); }
  lab.appendChild(document.createTextNode(ln.label));
  lab.title = "rank " + ln.rank + " " + ln.label;
  root.appendChild(lab);
  prev = ln.rank;
});
var H = y + AXIS, lo = Infinity, hi = -Infinity;
lanes.forEach(function (ln) {
  for (var i = 0; i < ln.e.length; i += F) { lo = Math.min(lo, ln.e[i]); hi = Math.max(hi, ln.e[i] + ln.e[i + 1]); }
});
D.marks.forEach(function (m) { lo = Math.min(lo, m.t0); hi = Math.max(hi, m.t1); });  // evidence off the lanes (a sync after the last step)
if (!isFinite(lo)) { lo = 0; hi = 1; }
var view = {a: lo, b: hi}, ref = lo, focus = null, drag = null;

D.steps.forEach(function (s) {
  var o = document.createElement("option"); o.value = String(s.step); o.textContent = "step " + s.step; sel.appendChild(o);
});
function stepWin(step) {
  for (var i = 0; i < D.steps.length; i++) if (D.steps[i].step === step) {
    var a = Infinity, b = -Infinity, w = D.steps[i].w;
    for (var r in w) { a = Math.min(a, w[r][0]); b = Math.max(b, w[r][1]); }
    return [a, b];
  }
  return null;
}
function setView(a, b) {
  var minSpan = 0.01;
  if (b - a < minSpan) { var m = (a + b) / 2; a = m - minSpan / 2; b = m + minSpan / 2; }
  view.a = a; view.b = b; draw();
}
function showStep(v) {
  sel.value = v;
  var w = v === "all" ? null : stepWin(Number(v));
  if (!w) { ref = lo; setView(lo, hi); return; }
  ref = w[0]; var pad = (w[1] - w[0]) * 0.02; setView(w[0] - pad, w[1] + pad);
}
function lower(e, v) {  // first event index with start >= v
  var a = 0, b = e.length / F;
  while (a < b) { var m = (a + b) >> 1; if (e[m * F] < v) a = m + 1; else b = m; }
  return a;
}
function ms(us) { return Math.abs(us) >= 1000 ? (us / 1000).toFixed(us >= 1e5 ? 1 : 3) + " ms" : us.toFixed(1) + " us"; }
function tickLabel(us, tick) {  // as many decimals as the tick needs, no more
  var unit = (tick >= 1000 || Math.abs(us) >= 1000) ? 1000 : 1, v = us / unit, d = Math.max(0, -Math.floor(Math.log10(tick / unit) + 1e-9));
  return v.toFixed(Math.min(d, 6)) + (unit === 1000 ? " ms" : " us");
}
function laneAt(py) { for (var i = 0; i < lanes.length; i++) if (py >= lanes[i].y && py < lanes[i].y + LH) return i; return -1; }

function draw() {
  var dpr = window.devicePixelRatio || 1, W = Math.max(root.clientWidth, 400);
  cv.width = W * dpr; cv.height = H * dpr; cv.style.width = W + "px"; cv.style.height = H + "px";
  var c = cv.getContext("2d"); c.setTransform(dpr, 0, 0, dpr, 0, 0); c.clearRect(0, 0, W, H);
  var x0 = LW, w = W - LW - 10, k = w / (view.b - view.a);
  function X(t) { return x0 + (t - view.a) * k; }
  function clip(v) { return Math.max(x0, Math.min(x0 + w, v)); }
  // step boundaries of every rank, behind the events
  c.fillStyle = "#f6f6f6";
  lanes.forEach(function (ln) { c.fillRect(x0, ln.y, w, LH); });
  c.strokeStyle = "#d5d5d5"; c.lineWidth = 1;
  D.steps.forEach(function (s) {
    for (var r in s.w) {
      var xa = X(s.w[r][0]); if (xa < x0 || xa > x0 + w) continue;
      var ls = lanes.filter(function (ln) { return String(ln.rank) === r; }); if (!ls.length) continue;
      c.beginPath(); c.moveTo(xa + 0.5, ls[0].y - 3); c.lineTo(xa + 0.5, ls[ls.length - 1].y + LH + 2); c.stroke();
    }
  });
  c.save(); c.beginPath(); c.rect(x0, 0, w, H - AXIS + 2); c.clip();  // nothing drawn over the lane labels
  lanes.forEach(function (ln) {
    var e = ln.e, n = e.length / F, lastX = -1, lastK = -1;
    for (var i = lower(e, view.a - ln.maxd - 1e-9); i < n; i++) {
      var t = e[i * F]; if (t > view.b) break;
      var d = e[i * F + 1], xa = X(t), xb = X(t + d);
      if (xb < x0) continue;
      xa = clip(xa); xb = clip(xb);
      var kk = e[i * F + 2];
      if (xb - xa < 1) { var px = Math.floor(xa); if (px === lastX && kk === lastK) continue; lastX = px; lastK = kk; xb = xa + 1; }
      c.fillStyle = COLORS[D.kinds[kk]] || "#777"; c.fillRect(xa, ln.y, xb - xa, LH);
    }
  });
  if (linksBox.checked) {
    var drawn = 0;
    D.links.forEach(function (L) {
      var a = Infinity, b = -Infinity;
      L.p.forEach(function (p) { a = Math.min(a, p[1]); b = Math.max(b, p[3]); });
      if (b < view.a || a > view.b || drawn > 4000) return;
      drawn++;
      L.p.forEach(function (p) {  // the wait: from this rank's arrival until the last rank arrived
        if (p[2] > p[1]) { c.fillStyle = "rgba(125,60,152,0.35)"; c.fillRect(clip(X(p[1])), lanes[p[0]].y - 1, Math.max(1, clip(X(p[2])) - clip(X(p[1]))), LH + 2); }
      });
      var pts = L.p.slice().sort(function (u, v) { return lanes[u[0]].y - lanes[v[0]].y; });
      c.strokeStyle = L.skew > 1 ? "rgba(150,30,20,0.8)" : "rgba(0,0,0,0.45)"; c.lineWidth = 1;
      c.beginPath();
      pts.forEach(function (p, j) { var xx = X(p[1]), yy = lanes[p[0]].y + LH / 2; if (j) c.lineTo(xx, yy); else c.moveTo(xx, yy); });
      c.stroke();
      pts.forEach(function (p) {
        var xx = X(p[1]); if (xx < x0 || xx > x0 + w) return;
        c.fillStyle = p[5] ? "#7b0000" : "#111"; c.fillRect(xx - 1, lanes[p[0]].y - 2, 2, LH + 4);
      });
    });
  }
  c.restore();
  D.marks.forEach(function (m) {
    var li = firstLane[m.rank]; if (li === undefined) return;
    var xx = X(m.t0); if (xx < x0 - 6 || xx > x0 + w + 6) return;
    var yy = lanes[li].y - 1;
    c.fillStyle = SEV[m.sev] || "#555"; c.beginPath(); c.moveTo(xx - 5, yy - 8); c.lineTo(xx + 5, yy - 8); c.lineTo(xx, yy); c.closePath(); c.fill();
  });
  if (focus) {
    var ls = lanes.filter(function (ln) { return focus.ranks.indexOf(ln.rank) >= 0 || ln.rank === focus.rank; });
    if (ls.length) {
      c.strokeStyle = SEV[focus.sev] || "#333"; c.lineWidth = 2;
      var fa = clip(X(focus.t0)), fb = Math.max(clip(X(focus.t1)), fa + 2);
      ls.forEach(function (ln) { c.strokeRect(fa, ln.y - 2, fb - fa, LH + 4); });
    }
  }
  // axis: ms from the chosen step's start (or from the first event)
  var span = view.b - view.a, raw = span / 8, mag = Math.pow(10, Math.floor(Math.log10(raw))), tick = mag;
  [1, 2, 5, 10].some(function (m) { tick = m * mag; return tick >= raw; });
  c.fillStyle = "#555"; c.strokeStyle = "#999"; c.font = "10px system-ui,sans-serif"; c.textAlign = "center";
  var ay = H - AXIS + 4; c.beginPath(); c.moveTo(x0, ay); c.lineTo(x0 + w, ay); c.stroke();
  for (var t = Math.ceil((view.a - ref) / tick) * tick; t <= view.b - ref; t += tick) {
    var tx = X(t + ref); c.beginPath(); c.moveTo(tx, ay); c.lineTo(tx, ay + 4); c.stroke();
    c.fillText(tickLabel(t, tick), tx, ay + 15);
  }
  rangeEl.textContent = "showing " + ms(span) + " from " + ms(view.a - ref);
  root.setAttribute("data-view", view.a.toFixed(3) + " " + view.b.toFixed(3));
  root.setAttribute("data-step", sel.value);
}

function pick(ev) {
  var r = cv.getBoundingClientRect(), px = ev.clientX - r.left, py = ev.clientY - r.top;
  var w = r.width - LW - 10, t = view.a + (px - LW) / w * (view.b - view.a), perPx = (view.b - view.a) / w;
  for (var j = 0; j < D.marks.length; j++) {
    var m = D.marks[j], li = firstLane[m.rank];
    if (li === undefined) continue;
    var mx = LW + (m.t0 - view.a) / perPx;
    if (Math.abs(px - mx) <= 6 && py >= lanes[li].y - 10 && py <= lanes[li].y) return {mark: m, px: px, py: py};
  }
  var li2 = laneAt(py); if (li2 < 0 || px < LW) return {px: px, py: py, t: t};
  var e = lanes[li2].e, best = -1;
  for (var i = lower(e, t - lanes[li2].maxd - perPx); i < e.length / F && e[i * F] <= t + perPx; i++) {
    if (e[i * F] + e[i * F + 1] + perPx >= t && (best < 0 || e[i * F + 1] < e[best * F + 1])) best = i;
  }
  return {lane: lanes[li2], i: best, px: px, py: py, t: t};
}
cv.addEventListener("mousemove", function (ev) {
  if (drag) {
    var dt = (ev.clientX - drag.x) / (cv.getBoundingClientRect().width - LW - 10) * (drag.b - drag.a);
    view.a = drag.a - dt; view.b = drag.b - dt; draw(); return;
  }
  var p = pick(ev), text = null;
  if (p.mark) text = p.mark.rule + " (" + p.mark.sev + "): " + p.mark.msg + "\nat " + p.mark.where + "; click for the finding";
  else if (p.lane && p.i >= 0) {
    var e = p.lane.e, i = p.i, n = e[i * F + 3];
    text = (n >= 0 ? D.names[n] : "(name not kept: see the note above)") + "\n" + D.kinds[e[i * F + 2]] + ", " + ms(e[i * F + 1]) +
      ", starts at " + ms(e[i * F] - ref) + (e[i * F + 4] >= 0 ? ", step " + e[i * F + 4] : "") + "\nrank " + p.lane.rank + " " + p.lane.label;
  }
  if (text === null) { tip.hidden = true; return; }
  tip.textContent = text; tip.hidden = false;
  tip.style.left = Math.min(p.px + 12, root.clientWidth - 320) + "px"; tip.style.top = (p.py + 14) + "px";
});
cv.addEventListener("mouseleave", function () { tip.hidden = true; drag = null; });
cv.addEventListener("mousedown", function (ev) { drag = {x: ev.clientX, a: view.a, b: view.b, moved: false}; cv.style.cursor = "grabbing"; });
window.addEventListener("mouseup", function () { drag = null; cv.style.cursor = ""; });
cv.addEventListener("click", function (ev) { var p = pick(ev); if (p.mark) location.hash = "#f-" + p.mark.fp; });
function zoom(f, at) {
  var t = at === undefined ? (view.a + view.b) / 2 : at;
  setView(t - (t - view.a) * f, t + (view.b - t) * f);
}
cv.addEventListener("wheel", function (ev) {
  ev.preventDefault();
  var p = pick(ev);
  if (ev.shiftKey) { var dt = (view.b - view.a) * ev.deltaY / 1000; setView(view.a + dt, view.b + dt); return; }
  zoom(Math.exp(ev.deltaY * 0.0015), p.t);
}, {passive: false});
cv.addEventListener("keydown", function (ev) {
  var s = view.b - view.a;
  if (ev.key === "w" || ev.key === "+") zoom(0.7);
  else if (ev.key === "s" || ev.key === "-") zoom(1 / 0.7);
  else if (ev.key === "a") setView(view.a - s * 0.2, view.b - s * 0.2);
  else if (ev.key === "d") setView(view.a + s * 0.2, view.b + s * 0.2);
  else return;
  ev.preventDefault();
});
cv.addEventListener("dblclick", function () { showStep(sel.value); });
document.getElementById("tl-in").addEventListener("click", function () { zoom(0.5); });
document.getElementById("tl-out").addEventListener("click", function () { zoom(2); });
document.getElementById("tl-reset").addEventListener("click", function () { focus = null; showStep(sel.value); });
sel.addEventListener("change", function () { focus = null; showStep(sel.value); });
linksBox.addEventListener("change", draw);
window.addEventListener("resize", draw);

var byFp = {};
D.marks.forEach(function (m) { byFp[m.fp] = m; });
function showFinding(fp) {
  var m = byFp[fp]; if (!m) return false;
  if (m.step !== null && stepWin(m.step)) { sel.value = String(m.step); ref = stepWin(m.step)[0]; }
  else { sel.value = "all"; ref = lo; }
  var pad = Math.max((m.t1 - m.t0) * 0.6, 5);
  focus = m; setView(m.t0 - pad, m.t1 + pad);
  root.scrollIntoView({block: "center"});
  return true;
}
document.querySelectorAll("a.show-tl").forEach(function (a) {
  a.addEventListener("click", function (ev) { if (showFinding(a.getAttribute("data-fp"))) ev.preventDefault(); });
});
document.querySelectorAll("a.go-step").forEach(function (a) {
  a.addEventListener("click", function (ev) {
    ev.preventDefault(); focus = null; showStep(a.getAttribute("data-step")); root.scrollIntoView({block: "center"});
  });
});
showStep(D.initial === null || D.initial === undefined ? "all" : String(D.initial));
// a link to one finding on the timeline: report.html#show-FINGERPRINT
var wanted = /^#show-([0-9a-f]+)$/.exec(location.hash);
if (wanted) showFinding(wanted[1]);
root.setAttribute("data-lanes", String(lanes.length));
root.setAttribute("data-ranks", String(D.ranks.length));
root.setAttribute("data-links", String(D.links.length));
root.setAttribute("data-marks", String(D.marks.length));
root.setAttribute("data-ready", "1");
})();
"""

SCRIPT_CSP = "'sha256-" + base64.b64encode(hashlib.sha256(SCRIPT.encode("utf-8")).digest()).decode() + "'"
