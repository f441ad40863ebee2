"""Tests for ``python -m slotkit demo`` (slotkit.demo): sites, table, chart, a real run."""

from __future__ import annotations

import io
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from itertools import pairwise
from pathlib import Path
from typing import Any, ClassVar

import pytest
import pytest_twisted
from scrapy.robotstxt import ProtegoRobotParser
from twisted.internet.error import DNSLookupError

from slotkit.demo.chart import render_svg
from slotkit.demo.monitor import CrawlTotals, ScopeTimeline
from slotkit.demo.options import DemoOptions
from slotkit.demo.sites import CRAWL_DELAY, SITES, DemoResolver, _SiteState
from slotkit.demo.table import COLUMNS, LiveTable, render_summary, render_table
from slotkit.headers import parse_rate_limit_headers
from slotkit.status import ScopeState
from tests.crawl import DispatchLog, DispatchRecordingHandler

REPO = Path(__file__).resolve().parent.parent
SVG = "{http://www.w3.org/2000/svg}"
PORT = 8080
HOSTS = [spec.host for spec in SITES]


def site(behaviour: str) -> _SiteState:
    (spec,) = [spec for spec in SITES if spec.behaviour == behaviour]
    return _SiteState(spec)


def state(scope_id: str, **changes: float) -> ScopeState:
    values: dict[str, object] = {
        "id": scope_id,
        "kind": "domain",
        "in_flight": 1,
        "waiting": 2,
        "concurrency": 4,
        "delay": 0.5,
        "current_delay": 0.5,
        "backoff_delay": None,
        "backoff_level": 0,
        "hold_remaining": 0.0,
        "triggers": 0,
        "steps": 0,
    }
    values.update(changes)
    return ScopeState(**values)  # type: ignore[arg-type]


def sample_timelines() -> list[ScopeTimeline]:
    fast = ScopeTimeline("fast.test")
    fast.transfers = [i / 10 for i in range(50)]
    fast.samples = [(t / 4, state("fast.test")) for t in range(20)]
    fast.pages = 48
    busy = ScopeTimeline("busy.test")
    busy.transfers = [0.5, 1.0, 3.2]
    busy.noted = [(1.0, 429)]
    busy.statuses.update({200: 2, 429: 1})
    busy.samples = [
        (0.0, state("busy.test")),
        (1.0, state("busy.test", hold_remaining=2.0, triggers=1)),
        (2.0, state("busy.test", hold_remaining=1.0, triggers=1)),
        (3.5, state("busy.test", triggers=1)),
    ]
    busy.holds = [(1.0, 2.0)]
    flaky = ScopeTimeline("flaky.test")
    flaky.transfers = [0.2, 0.4, 2.0]
    flaky.noted = [(0.4, 503)]
    flaky.statuses.update({200: 2, 503: 1})
    flaky.steps = [0.5]
    flaky.samples = [
        (0.0, state("flaky.test", delay=0.1, current_delay=0.1)),
        (
            0.5,
            state(
                "flaky.test",
                current_delay=1.0,
                backoff_delay=1.0,
                backoff_level=1,
                steps=1,
                triggers=1,
            ),
        ),
    ]
    return [fast, busy, flaky]


# ----------------------------------------------------------------- the sites


def test_sites_are_distinct_test_hosts():
    """Five sites, each a .test name (reserved, never real), with its own scope entry."""
    assert len(HOSTS) == len(set(HOSTS)) == 5
    assert all(host.endswith(".test") for host in HOSTS)
    assert {spec.behaviour for spec in SITES} == {
        "healthy",
        "bursts",
        "quota",
        "crawl_delay",
        "flaky",
    }


def test_resolver_answers_loopback_for_demo_hosts_only():
    """The demo resolver maps its hosts to 127.0.0.1 and refuses every other name."""
    resolver = DemoResolver(HOSTS)
    results: list[object] = []
    resolver.getHostByName("FAST.test").addBoth(results.append)
    resolver.getHostByName("example.com").addBoth(results.append)
    assert results[0] == "127.0.0.1"
    assert results[1].check(DNSLookupError)  # type: ignore[attr-defined]


def test_pages_link_to_the_next_page_of_their_chain():
    """A healthy page links (rel=next) to the page one chain-length further."""
    fast = site("healthy")
    answer = fast.answer("/page/3", now=0.0, port=PORT)
    assert answer.status == 200
    nxt = 3 + fast.spec.chains
    assert f'rel="next" href="http://fast.test:{PORT}/page/{nxt}"'.encode() in answer.body
    assert fast.answer("/nope", now=0.0, port=PORT).status == 404


def test_busy_site_answers_429_with_retry_after_during_bursts():
    """busy.test is fine at first, then answers 429 + Retry-After: 2 during its burst."""
    busy = site("bursts")
    params = busy.spec.params
    assert busy.answer("/page/0", now=100.0, port=PORT).status == 200
    during = busy.answer("/page/1", now=100.0 + params["start"] + 0.5, port=PORT)
    assert during.status == 429
    assert during.headers["Retry-After"] == "2"
    after = 100.0 + params["start"] + params["length"] + 0.5
    assert busy.answer("/page/2", now=after, port=PORT).status == 200
    next_burst = 100.0 + params["start"] + params["period"] + 0.1
    assert busy.answer("/page/3", now=next_burst, port=PORT).status == 429


def test_api_enforces_its_quota_with_ratelimit_headers():
    """The API allows `quota` requests per window, then 429s with a reset slotkit understands."""
    api = site("quota")
    quota = int(api.spec.params["quota"])
    window = api.spec.params["window"]
    answers = [api.answer(f"/page/{i}", now=10.0 + i * 0.01, port=PORT) for i in range(quota + 1)]
    assert [a.status for a in answers] == [200] * quota + [429]
    last_ok = answers[quota - 1]
    assert last_ok.headers["X-RateLimit-Remaining"] == "0"
    rejected = answers[-1]
    hint = parse_rate_limit_headers(rejected.headers, now=0.0)
    assert hint.delay is not None
    assert 0 < hint.delay <= window
    assert api.answer("/page/99", now=10.0 + window + 0.01, port=PORT).status == 200


def test_polite_site_robots_txt_has_the_crawl_delay():
    """polite.test's robots.txt asks for CRAWL_DELAY seconds, as Scrapy's parser reads it."""
    polite = site("crawl_delay")
    answer = polite.answer("/robots.txt", now=0.0, port=PORT)
    parser = ProtegoRobotParser(answer.body, spider=None)
    assert parser.rp.crawl_delay("*") == CRAWL_DELAY
    assert "delay" not in polite.spec.scope  # it comes from robots.txt


def test_polite_site_is_paced_by_hand_without_robots_support(monkeypatch):
    """TODO(robots): where slotkit cannot apply Crawl-delay, the scope gets it as its delay."""
    from slotkit.demo import sites

    polite = site("crawl_delay").spec
    monkeypatch.setattr(sites, "slotkit_applies_crawl_delay", lambda: False)
    assert sites.robots_fallback(polite) == {"concurrency": 1, "delay": CRAWL_DELAY, "jitter": 0}
    monkeypatch.setattr(sites, "slotkit_applies_crawl_delay", lambda: True)
    assert sites.robots_fallback(polite) == {"jitter": 0}


def test_flaky_site_fails_about_its_rate():
    """flaky.test answers 503 to roughly its configured share of requests (seeded)."""
    flaky = site("flaky")
    statuses = [flaky.answer(f"/page/{i}", now=0.0, port=PORT).status for i in range(1000)]
    share = statuses.count(503) / len(statuses)
    assert abs(share - flaky.spec.params["rate"]) < 0.03
    assert set(statuses) == {200, 503}


# ----------------------------------------------------------------- the table


def test_table_has_a_title_the_header_and_one_row_per_scope():
    """The live table: a status line, the column titles, then the scopes in order."""
    timelines = sample_timelines()
    totals = CrawlTotals(in_downloader=5, at_gate=2, in_scheduler=7, transfers=56, pages=50)
    lines = render_table(timelines, now=4.9, totals=totals, duration=45, labels={"fast.test": "ok"})
    assert lines[0].startswith("slotkit demo    4.9s / 45s")
    assert lines[1].split()[:3] == ["scope", "site", "req/s"]
    assert [line.split()[0] for line in lines[2:]] == ["fast.test", "busy.test", "flaky.test"]
    assert "level 1 (1.0s)" in lines[4]


def test_live_table_redraws_in_place_on_a_terminal():
    """On a terminal the second update moves the cursor up over the first one."""
    stream = io.StringIO()
    table = LiveTable(stream, redraw=True)
    table.update(["a", "b"])
    table.update(["c", "d"])
    assert stream.getvalue() == "a\nb\n\x1b[2F\x1b[Jc\nd\n"


def test_plain_table_appends_blocks_without_escapes():
    """Anywhere else each update is a plain block followed by a blank line."""
    stream = io.StringIO()
    table = LiveTable(stream, redraw=False)
    table.update(["a"])
    table.update(["b"])
    assert stream.getvalue() == "a\n\nb\n\n"


def test_summary_counts_per_site_and_overall():
    """The summary has one row per scope and the crawl-wide counts from the stats."""
    stats = {
        "throttling/backoff/resent": 3,
        "retry/count": 1,
        "throttling/requests_delayed": 4,
        "throttling/wait_time_total": 2.5,
        "throttling/wait_time_max": 1.25,
        "throttling/backoff/header_hints": 3,
    }
    errors = {"HttpError": 1, "GateClosedError": 2}
    lines = render_summary(sample_timelines(), elapsed=5.0, stats=stats, errors=errors)
    assert lines[0] == "Summary: 48 pages in 5.0 s (56 transfers)"
    busy = next(line for line in lines if line.startswith("busy.test")).split()
    assert busy[:7] == ["busy.test", "0", "3", "1", "0", "0", "1"]  # one hold, no step
    flaky = next(line for line in lines if line.startswith("flaky.test")).split()
    assert flaky[3:6] == ["0", "1", "1"]  # one 503, one backoff step
    text = "\n".join(lines)
    assert "Re-sent by slotkit after a rate limit (429, no retry used): 3" in text
    assert "(total 2.5 s, longest 1.2 s)" in text or "(total 2.5 s, longest 1.3 s)" in text
    assert "Errors seen by the spider: HttpError 1" in text
    assert "Still waiting for their scopes when the crawl stopped: 2" in text
    # a probe: a first-time reader could not tell what "level 2" and "hold 1.6s" meant
    assert "'level N (Xs)': backoff raised the scope's delay N steps" in text
    assert "'hold Xs': the whole" in text


def test_a_port_out_of_range_is_a_usage_error(capsys):
    """A probe: --port 99999 ended in a raw traceback."""
    from slotkit.cli import build_parser

    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["demo", "--port", "99999"])
    assert info.value.code == 2
    assert "expected a port from 0 to 65535" in capsys.readouterr().err


@pytest.mark.integration
def test_a_port_in_use_is_one_line_not_a_traceback():
    """The port is the machine's state, not a bug in the demo."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "slotkit", "demo", "--quick", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 1
    assert f"127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr


def test_options_pick_redraw_and_refresh():
    """--plain or a pipe mean plain blocks every 5 s; a terminal means a redraw every 1 s."""
    from slotkit.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["demo", "--quick"])
    assert DemoOptions.from_args(args, tty=True).redraw
    assert DemoOptions.from_args(args, tty=True).refresh == 1.0
    assert DemoOptions.from_args(args, tty=False).refresh == 5.0
    assert DemoOptions.from_args(args, tty=False).duration == 5.0
    plain = parser.parse_args(["demo", "--plain", "--duration", "30", "--refresh", "2"])
    options = DemoOptions.from_args(plain, tty=True)
    assert (options.redraw, options.refresh, options.duration) == (False, 2.0, 30.0)


# ----------------------------------------------------------------- the chart


def test_chart_is_valid_svg_with_a_panel_per_scope():
    """The chart parses as XML, has one panel per scope, holds, steps and status ticks."""
    text = render_svg(sample_timelines(), duration=5.0, labels={"busy.test": "429 & <bursts>"})
    root = ET.fromstring(text)
    assert root.tag == f"{SVG}svg"
    panels = [g for g in root.iter(f"{SVG}g") if g.get("class") == "scope"]
    assert [g.get("data-scope") for g in panels] == ["fast.test", "busy.test", "flaky.test"]
    classes = [element.get("class") for element in root.iter()]
    assert classes.count("hold") == 1
    assert classes.count("step") == 1
    assert classes.count("status-429") == 1
    assert classes.count("status-503") == 1
    assert classes.count("delay") == 3
    assert "429 &amp; &lt;bursts&gt;" in text


def test_chart_of_an_empty_run_is_still_valid():
    """No scopes and no time still give a well-formed document."""
    root = ET.fromstring(render_svg([], duration=0.0))
    assert root.tag == f"{SVG}svg"


# ----------------------------------------------------------------- real runs


class _DemoDispatches(DispatchRecordingHandler):
    """Scrapy's HTTP handler noting each dispatch of the demo crawl in ``log``."""

    log: ClassVar[DispatchLog] = []

    def __init__(self, crawler: Any) -> None:
        super().__init__(crawler)
        self._dispatches = self.log


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_run_demo_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A short demo on the test reactor crawls every site, paces polite.test, writes the chart."""
    from twisted.internet import reactor

    from slotkit.demo import run as demo_run
    from slotkit.demo.run import run_demo

    # Pacing is measured where the downloader lets requests go: response times
    # also carry each one's round trip (the first pays for connection set-up).
    demo_settings = demo_run.demo_settings
    monkeypatch.setattr(
        demo_run,
        "demo_settings",
        lambda *args, **kwargs: {
            **demo_settings(*args, **kwargs),
            "DOWNLOAD_HANDLERS": {"http": _DemoDispatches},
        },
    )
    _DemoDispatches.log.clear()
    out = io.StringIO()
    chart = tmp_path / "chart.svg"
    options = DemoOptions(duration=3.0, chart=chart, redraw=False, refresh=1.0)
    old_resolver = reactor.nameResolver  # type: ignore[attr-defined]
    result = await run_demo(reactor, options, out)
    assert reactor.nameResolver is old_resolver  # type: ignore[attr-defined]
    text = out.getvalue()
    headers = [line.split() for line in text.splitlines() if line.startswith("scope ")]
    assert headers
    assert headers[0][:3] == list(COLUMNS[:3])
    assert result.pages["fast.test"] > 20
    polite = sorted(t for host, _, t in _DemoDispatches.log if host == "polite.test")
    gaps = [b - a for a, b in pairwise(polite)]
    assert gaps
    assert min(gaps) >= CRAWL_DELAY - 1e-3  # float rounding of reactor times
    (api,) = [t for t in result.timelines if t.id == "api.test"]
    assert api.statuses[429] == 0  # its quota is configured: spent, never overspent
    assert set(result.pages) == set(HOSTS)
    ET.parse(chart)
    assert "Timeline chart:" in text


@pytest.mark.integration
def test_demo_quick_end_to_end(tmp_path: Path):
    """``python -m slotkit demo --quick`` runs in a subprocess, prints the table and a summary,
    and writes a valid SVG."""
    chart = tmp_path / "timeline.svg"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "slotkit", "demo", "--quick", "--chart", str(chart)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert elapsed < 25, f"the quick demo took {elapsed:.1f}s"
    out = done.stdout
    header = next(line for line in out.splitlines() if line.startswith("scope"))
    assert header.split()[:4] == ["scope", "site", "req/s", "delay"]
    assert "\x1b[" not in out  # not a terminal: plain blocks
    assert "Summary:" in out
    for host in HOSTS:
        assert any(line.startswith(host) for line in out.splitlines())
    assert f"Timeline chart: {chart}" in out
    root = ET.parse(chart).getroot()
    assert root.tag == f"{SVG}svg"
    scopes = {g.get("data-scope") for g in root.iter(f"{SVG}g") if g.get("class") == "scope"}
    assert scopes == set(HOSTS)
    assert "Traceback" not in done.stderr
