"""The planner's HTML report: self-contained, escaped, and it renders in headless Chromium.

The results are built by hand from the simulator run on toy costs (tests/helpers/toy_costs.py),
so the test does not depend on the real stage cost models. Chromium is driven through the
DevTools protocol over a pipe (``--remote-debugging-pipe``: JSON messages ended by a NUL byte
on file descriptors 3 and 4), so no websocket library is needed. The browser's console
errors, uncaught exceptions and network requests are collected while the page loads; the
screenshot goes to artifacts/report/ (gitignored).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import re
import shutil
import struct
import subprocess
import threading
import time
import zlib
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("plotly")

from rlperf.accuracy import stated_interval
from rlperf.algorithms import get_algorithm
from rlperf.api import PlanAnswer, RunPoint, RunTotals
from rlperf.frameworks import export_verl
from rlperf.plan.memory_breakdown import concrete_plan, memory_breakdown
from rlperf.plan.explain import Explanation, WhatIf, bottlenecks
from rlperf.plan.search import PlanEvaluation, PlanSearchResult, _pareto
from rlperf.plan.space import Rejected
from rlperf.report.html import REPORT_NAME, write_report
from rlperf.scenario import Scenario, load_scenario
from rlperf.sim.kernel import Segment
from rlperf.sim.result import SimResult
from rlperf.sim.simulate import SimConfig, simulate
from rlperf.specs.plan import ExecutionMode, Placement, Plan
from rlperf.specs.response_lengths import choose_response_lengths
from tests.helpers.toy_costs import ToyCosts, toy_sampler

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts" / "report"
CHROMIUM = next((p for p in (shutil.which("chromium"), "/usr/bin/chromium") if p and os.path.exists(p)), None)
FIGURES = ("fig-run", "fig-timeline", "fig-stages", "fig-memory", "fig-pareto")
EVIL = "<script>alert('x')</script>"
WIDTH, HEIGHT = 1400, 3000


def _scenario() -> Scenario:
    return load_scenario({
        "name": "toy-grpo", "model": "Qwen3-8B", "cluster": {"gpu": "H100", "num_nodes": 1, "gpus_per_node": 8},
        "workload": {"preset": "deepscaler-8k", "prompts_per_step": 16, "group_size": 4},
    })


def _sim(plan: Plan, gpus: int, price: float | None) -> SimResult:
    c = SimConfig(name="toy-grpo", algorithm=get_algorithm("GRPO"), plan=plan, num_gpus=gpus, prompts_per_step=16,
                  group_size=4, sample=toy_sampler(0), minibatches=2, iterations=4, warmup=1, price_usd_per_gpu_hour=price)
    return simulate(c, ToyCosts())


def build_results(sc: Scenario) -> tuple[PlanSearchResult, Explanation]:
    price = sc.cluster.accelerator.price_usd_per_hour
    split = Placement(kind="disaggregated", rollout_gpus=4)
    plans: list[tuple[str, Plan, int, str]] = [
        ("framework default: colocated sync", Plan(), 8, "baseline"),
        ("framework default: disaggregated 4+4 sync", Plan(placement=split), 8, "baseline"),
        ("disaggregated 4+4 | async s1", Plan(placement=split, mode=ExecutionMode(kind="one_step_off")), 8, "search"),
        ("disaggregated 4+4 | async s2", Plan(placement=split, mode=ExecutionMode(kind="async", staleness=2)), 8, "search"),
        ("disaggregated 6+2 | partial rollout 300", Plan(placement=Placement(kind="disaggregated", rollout_gpus=6),
                                                     mode=ExecutionMode(kind="partial_rollout", token_budget=300)), 8, "search"),
        ("disaggregated 2+2 | async s1", Plan(placement=Placement(kind="disaggregated", rollout_gpus=2),
                                              mode=ExecutionMode(kind="one_step_off")), 4, "search"),
        (f"your plan {EVIL}", Plan(mode=ExecutionMode(fusion=True)), 8, "user"),
    ]
    evals = [PlanEvaluation(label, plan, gpus, None, _sim(plan, gpus, price), src) for label, plan, gpus, src in plans]
    evals.append(PlanEvaluation("colocated | gen tp8 | infeasible", Plan(), 8, None, None, "search", error="out of memory"))
    evals.append(PlanEvaluation("framework default: hybrid", Plan(), 8, None, None, "baseline", error="actor memory 120 GB > 80 GB"))
    ok = sorted((e for e in evals if e.sim is not None), key=lambda e: (e.step_time_s, e.label))
    user = next(e for e in evals if e.source == "user")
    rejected = tuple(Rejected(f"8 GPUs | colocated | gen tp{t} | train tp{t} pp1 cp1 mb16k | sync",
                              f"actor memory {100 + t} GB > 80 GB per GPU") for t in (1, 2, 4, 8) for _ in range(15))
    rejected += (Rejected(f"8 GPUs | {EVIL}", f"reason with {EVIL}"),)
    res = PlanSearchResult(
        scenario=sc.name, num_gpus=8, considered=200, rejected=rejected,
        evaluated=tuple(e for e in ok if e.source == "search"), best=ok[0], pareto=_pareto(ok),
        baselines=tuple(e for e in evals if e.source == "baseline"), user=user, estimates_per_s=12_345.0,
        component_evaluations=321, elapsed_s=1.5, notes=("fast estimate: 200 candidates in 0.02 s",),
    )
    assert user.sim is not None
    variant = ok[0]
    assert variant.sim is not None
    what_ifs = (
        WhatIf(variant.label, variant.step_time_s, user.step_time_s / variant.step_time_s, variant.staleness),
        WhatIf("more rollout GPUs (infeasible)", float("inf"), 0.0, 0, note=f"memory: {EVIL}"),
    )
    lb = user.sim.bounds.lower_bound_s
    return res, Explanation(bottlenecks(user.sim), lb, user.step_time_s / lb, what_ifs)


def _run(best: PlanEvaluation) -> RunTotals:
    """Ten steps whose step time grows by half from the first to the last (as from a length growth)."""
    t0 = best.step_time_s
    curve = tuple(t0 * (1 + 0.5 * i / 9) for i in range(10))
    points = (RunPoint(0, 2000.0, curve[0], None), RunPoint(9, 4000.0, curve[-1], None))
    return RunTotals(10, best.num_gpus, points, curve, sum(curve), None, stated_interval(t0).scaled(sum(curve) / t0))


def answer_of(sc: Scenario, res: PlanSearchResult, explanation: Explanation) -> PlanAnswer:
    """The answer the API would give around the hand-built search result."""
    best = res.best
    choice = choose_response_lengths(sc.workload.max_response_tokens)
    return PlanAnswer(
        question=sc, lengths=choice, search=res, best_plan=concrete_plan(best.plan, best.num_gpus),
        interval=stated_interval(best.step_time_s), memory=memory_breakdown(sc, best.plan, best.num_gpus),
        user_memory=memory_breakdown(sc, sc.plan, sc.cluster.num_gpus), explanation=explanation, run=_run(best), sweep=(),
        framework="verl", launch=export_verl(sc.with_plan(best.plan)),
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PlanSearchResult]:
    sc = _scenario()
    res, explanation = build_results(sc)
    path = write_report(tmp_path_factory.mktemp("report"), answer_of(sc, res, explanation))
    assert path.name == REPORT_NAME
    return path, res


_TITLE = """JSON.stringify((() => { const h = document.querySelector('h1'); const r = h.getBoundingClientRect();
  return {text: h.innerText, top: r.top, bottom: r.bottom, visible: r.width > 0 && r.height > 0}; })())"""


class _Refs(HTMLParser):
    """Every URL a tag would load (src, href, and url(...) in style blocks)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str]] = []
        self._style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._style = tag == "style"
        for k, v in attrs:
            if k in ("src", "href", "data", "srcset", "poster") and v is not None:
                self.urls.append((tag, v))

    def handle_data(self, data: str) -> None:
        if self._style:
            self.urls += [("style", u) for u in re.findall(r"url\(\s*['\"]?([^'\")]+)", data)]


def test_report_is_one_self_contained_file(report: tuple[Path, PlanSearchResult]) -> None:
    path, res = report
    text = path.read_text(encoding="utf-8")
    assert [p.name for p in path.parent.iterdir()] == [REPORT_NAME]
    refs = _Refs()
    refs.feed(text)
    external = [(t, u) for t, u in refs.urls if re.match(r"^\s*(https?:)?//", u, re.I)]
    assert external == []
    assert not re.search(r"<script[^>]*\bsrc\s*=", text, re.I), "plotly.js must be inline"
    assert "Plotly.newPlot" in text and len(text.encode()) < 1_500_000  # plotly.js inline once, the page small
    for fig in FIGURES:
        assert f'id="{fig}"' in text
    for anchor in ("summary", "ranked", "breakdown", "launch", "run", "timeline", "stages", "memory", "pareto", "workdepth",
                   "explanation", "rejected"):
        assert f'<section id="{anchor}">' in text
    # Text is escaped: the hostile label and reason appear only escaped.
    assert EVIL not in text
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in text
    # Rejected plans: one row per reason, with the count of all.
    reasons = {r.reason for r in res.rejected}
    assert f"{len(res.rejected):,} candidates rejected for {len(reasons)} reasons." in text
    section = text.split('<section id="rejected">', 1)[1].split("</section>", 1)[0]
    assert section.count("<tr>") == 1 + len(reasons)
    # The title and the scenario row name the user's model and algorithm; labels are defined.
    assert "<h1>rlperf plan: GRPO on Qwen3-8B, 1 x 8" in text and "mbNk: token budget" in text
    # The infeasible baseline stays in the comparison, saying why.
    assert "infeasible: actor memory 120 GB" in text.split('<section id="summary">', 1)[1].split("</section>", 1)[0]


def test_timeline_keeps_pools_and_the_replicas_that_finish_last() -> None:
    from dataclasses import replace

    from rlperf.report.figures import MAX_TIMELINE_TRACKS, steady_segments, timeline_tracks

    n = 50
    segs = [Segment("train", "actor_update", 0.0, 1.0, 4, 1), Segment("rollout", "weight_sync", 0.0, 0.5, 4, 1)]
    segs += [Segment(f"rollout/replica-{i}", "generate/decode", 0.0, 10.0 + i, 1, 1) for i in range(n)]
    rows, dropped = timeline_tracks(segs)
    room = MAX_TIMELINE_TRACKS - 2
    assert rows == ["rollout", *(f"rollout/replica-{i}" for i in range(n - room, n)), "train"]
    assert dropped == n - room
    # Steady state only (iteration >= warm-up); touching spans of one stage on a track merge.
    sim = replace(_sim(Plan(), 8, None), warmup=1, segments=(
        Segment("all/replica-0", "decode", 0.0, 1.0, 1, 0),
        Segment("all/replica-0", "decode", 1.0, 2.0, 1, 1), Segment("all/replica-0", "generate/decode", 2.0, 3.0, 1, 1),
        Segment("all/replica-0", "prefill", 3.0, 3.5, 1, 1), Segment("all", "actor_update", 4.0, 5.0, 8, 1)))
    assert [(s.track, s.name, s.start_s, s.end_s) for s in steady_segments(sim)] == [
        ("all", "actor_update", 4.0, 5.0), ("all/replica-0", "decode", 1.0, 3.0), ("all/replica-0", "prefill", 3.0, 3.5)]


# --- headless Chromium over the DevTools protocol (pipe transport) ---------------------------


def _above(fd: int, low: int) -> int:
    """``fd`` moved to a descriptor number >= ``low`` (the old one closed)."""
    new = fcntl.fcntl(fd, fcntl.F_DUPFD, low)
    os.close(fd)
    return new


class Chromium:
    """A headless Chromium driven over ``--remote-debugging-pipe``: we write commands on its fd
    3 and read replies and events from its fd 4, each a JSON object ended by a NUL byte."""

    def __init__(self, exe: str, profile_dir: Path) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # The child's ends must not sit on fds 3 or 4 themselves (the shell would close them).
        to_browser_r, from_browser_w = (_above(fd, 10) for fd in (to_browser_r, from_browser_w))
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-extensions", "--disable-dev-shm-usage", "--hide-scrollbars", f"--window-size={WIDTH},{HEIGHT}",
                 f"--user-data-dir={profile_dir}", "--remote-debugging-pipe", "about:blank"]
        # bash (dash takes one-digit fds only) puts the pipe ends on fds 3 and 4, then execs the browser.
        script = f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w} {to_browser_r}<&- {from_browser_w}>&-'
        self.proc = subprocess.Popen(["/bin/bash", "-c", script, exe, *flags], pass_fds=(to_browser_r, from_browser_w),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._inbox: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        self._id = 0
        self._stderr: list[bytes] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._drain_stderr, daemon=True).start()

    def _read(self) -> None:
        buf = b""
        while chunk := os.read(self._from_browser, 1 << 16):
            buf += chunk
            *msgs, buf = buf.split(b"\0")
            for m in msgs:
                self._inbox.put(json.loads(m))
        self._inbox.put(None)

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    def _next(self, deadline: float) -> dict[str, Any]:
        try:
            msg = self._inbox.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            raise TimeoutError("no answer from Chromium") from None
        if msg is None:
            raise RuntimeError("Chromium closed the pipe: " + b"".join(self._stderr[-20:]).decode(errors="replace"))
        return msg

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout_s: float = 20.0) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while True:
            m = self._next(deadline)
            if m.get("id") == self._id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})  # type: ignore[no-any-return]
            self.events.append(m)

    def wait_event(self, method: str, timeout_s: float = 20.0, after: int = 0) -> dict[str, Any]:
        """The first event ``method`` from ``self.events[after:]`` on, waiting for it if need be."""
        deadline = time.monotonic() + timeout_s
        while True:
            for e in self.events[after:]:
                if e.get("method") == method:
                    return e
            self.events.append(self._next(deadline))

    def evaluate(self, session: str, expression: str) -> Any:
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
        assert "exceptionDetails" not in r, r
        return r["result"].get("value")

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout_s=5)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)


def console_errors(events: list[dict[str, Any]]) -> list[str]:
    """Uncaught exceptions, console.error/assert calls and error log entries, as text."""
    out = []
    for e in events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            out.append(f"uncaught: {d.get('exception', {}).get('description') or d.get('text')}")
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console." + p["type"] + ": " + " ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
        elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
            out.append(f"log: {p['entry'].get('text')} ({p['entry'].get('url', '')})")
    return out


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    w, h = struct.unpack(">II", data[16:24])
    return w, h


def png_distinct_bytes(data: bytes) -> int:
    """Distinct byte values of the decompressed image data (a blank page has very few)."""
    idat, pos = b"", 8
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + n]
        pos += 12 + n
    return len(set(zlib.decompress(idat)))


_RENDERED = """JSON.stringify(Array.from(document.querySelectorAll('.plotly-graph-div')).map(d => ({
  id: d.id, svg: d.querySelectorAll('.main-svg').length,
  marks: d.querySelectorAll('.barlayer .point, .scatterlayer .point').length,
  legend: d.querySelectorAll('.legend .traces').length})))"""


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)")
def test_report_renders_in_headless_chromium(report: tuple[Path, PlanSearchResult], tmp_path: Path) -> None:
    path, _ = report
    assert CHROMIUM is not None
    browser = Chromium(CHROMIUM, tmp_path / "profile")
    try:
        # The first answer waits for the browser's start-up too (a fresh profile, the font cache
        # on a fresh machine, two xdist workers on two cores): one fresh-clone CI run at 12cc784
        # got no answer within 20 s. Later commands keep 20 s.
        target = browser.send("Target.createTarget", {"url": "about:blank"}, timeout_s=120)["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page", "Network"):
            browser.send(f"{domain}.enable", {}, session)
        browser.send("Emulation.setDeviceMetricsOverride",
                     {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False}, session)
        browser.send("Page.navigate", {"url": path.as_uri()}, session)
        browser.wait_event("Page.loadEventFired", timeout_s=30)
        # Plotly draws in promises after load: wait until every figure has its SVG and marks.
        deadline = time.monotonic() + 20
        while True:
            figs = {f["id"]: f for f in json.loads(browser.evaluate(session, _RENDERED))}
            if all(f["svg"] > 0 and f["marks"] > 0 for f in figs.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        height = int(browser.evaluate(session, "document.documentElement.scrollHeight"))
        shot = browser.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                       "clip": {"x": 0, "y": 0, "width": WIDTH, "height": height, "scale": 1}},
                            session, timeout_s=30)
        top = browser.send("Page.captureScreenshot", {"format": "png"}, session)
        title = json.loads(browser.evaluate(session, _TITLE))
        # The error check itself: a page that throws and logs an error must be caught.
        broken = tmp_path / "broken.html"
        broken.write_text("<!DOCTYPE html><script>console.error('rlperf: logged'); rlperf_undefined();</script>")
        mark = len(browser.events)
        browser.send("Page.navigate", {"url": broken.as_uri()}, session)
        browser.wait_event("Page.loadEventFired", after=mark)
        report_events, broken_events = browser.events[:mark], browser.events[mark:]
    finally:
        browser.close()

    # (1) No console errors and no uncaught exceptions, and nothing fetched from a network.
    assert console_errors(report_events) == []
    caught = console_errors(broken_events)
    assert any("rlperf_undefined is not defined" in c for c in caught) and any("rlperf: logged" in c for c in caught), caught
    urls = [e["params"]["request"]["url"] for e in report_events if e.get("method") == "Network.requestWillBeSent"]
    assert urls and all(re.match(r"^(file|data|blob|about):", u) for u in urls), urls
    # (2) Every figure rendered: plotly's SVG, with bars or markers, and a legend where it has one.
    assert set(figs) == set(FIGURES), figs
    for f in figs.values():
        assert f["svg"] > 0 and f["marks"] > 0, f
    assert figs["fig-timeline"]["legend"] >= 4 and figs["fig-stages"]["legend"] >= 4
    # The first screen's screenshot shows the title, and the title names the user's model and algorithm.
    assert "Qwen3-8B" in title["text"] and "GRPO" in title["text"], title
    assert title["visible"] and 0 <= title["top"] and title["bottom"] <= HEIGHT, title
    # (3) Screenshots: the whole page and the first screen, non-trivial PNGs, kept as artifacts.
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for name, b64 in (("plan-report-full.png", shot["data"]), ("plan-report.png", top["data"])):
        data = base64.b64decode(b64)
        (ARTIFACTS / name).write_bytes(data)
        assert png_size(data) == (WIDTH, HEIGHT if name == "plan-report.png" else height)
        assert len(data) > 50_000 and png_distinct_bytes(data) > 64
    shutil.copyfile(path, ARTIFACTS / REPORT_NAME)


def test_spans_under_a_pixel_merge_into_their_neighbour() -> None:
    from rlperf.report.figures import merge_invisible

    segs = [Segment("all/replica-0", "prefill", 0.0, 0.01, 1, 1), Segment("all/replica-0", "decode", 0.01, 5.0, 1, 1),
            Segment("all/replica-0", "prefill", 5.0, 5.01, 1, 1), Segment("all/replica-0", "decode", 5.01, 9.0, 1, 1),
            Segment("all", "actor_update", 9.0, 9.005, 8, 1), Segment("all", "weight_sync", 9.005, 9.5, 8, 1)]
    out, absorbed = merge_invisible(segs, 0.1)
    # The replica's four spans become one decode span; pool rows are never merged.
    assert [(s.track, s.name, s.start_s, s.end_s) for s in out] == [
        ("all", "actor_update", 9.0, 9.005), ("all", "weight_sync", 9.005, 9.5), ("all/replica-0", "decode", 0.0, 9.0)]
    assert absorbed == 3
    assert merge_invisible(segs, 0.001)[1] == 0
