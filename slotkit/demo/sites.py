"""The demo's web server: five sites on one loopback port, told apart by the Host header.

Every demo host name (``fast.test``, ``busy.test`` ...; ``.test`` is reserved
for exactly this) resolves to 127.0.0.1 through :class:`DemoResolver`, which
refuses every other name, so the crawl cannot leave the machine. The server
listens on 127.0.0.1 only.

Each site serves ``/page/<n>``: a small page linking to ``/page/<n + chains>``,
so a site is walked as a few parallel chains and the crawl never runs out of
pages. The sites differ in how they answer:

``fast.test``
    Always 200, after a short latency.
``busy.test``
    Overloaded in bursts: during a few seconds of every period it answers 429
    with ``Retry-After: 2``.
``api.test``
    A JSON API with a quota of N requests per fixed window. Every answer
    carries ``RateLimit-Policy``/``RateLimit`` and ``X-RateLimit-*`` headers;
    over the quota it answers 429.
``polite.test``
    Healthy, but its robots.txt asks for a ``Crawl-delay``.
``flaky.test``
    Answers 503 to a random share of requests (seeded, so runs are alike).

Nothing here reads the wall clock: times come from the reactor given to
:class:`DemoServer`.
"""

from __future__ import annotations

import importlib.util
import json
import math
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import fail, succeed
from twisted.internet.error import DNSLookupError
from twisted.internet.interfaces import IResolverSimple
from twisted.web import server
from twisted.web.resource import Resource
from zope.interface import implementer

if TYPE_CHECKING:
    from collections.abc import Sequence

    from twisted.internet.defer import Deferred
    from twisted.internet.interfaces import IDelayedCall

__all__ = [
    "LOOPBACK",
    "SITES",
    "DemoResolver",
    "DemoServer",
    "SiteSpec",
    "robots_fallback",
]

#: The only address the demo server binds and the resolver answers.
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class SiteSpec:
    """One demo site: its host name, what it does, and how the crawl treats it."""

    host: str
    #: A few words for the table and the chart.
    label: str
    #: How the server answers: "healthy", "bursts", "quota", "crawl_delay", "flaky".
    behaviour: str
    #: Seconds the server takes to answer a page.
    latency: float = 0.05
    #: Parallel page chains the spider walks on this site.
    chains: int = 6
    #: The ``THROTTLING_SCOPES`` entry the demo crawl uses for this site.
    scope: dict[str, Any] = field(default_factory=dict)
    #: Behaviour parameters.
    params: dict[str, float] = field(default_factory=dict)


#: The Crawl-delay polite.test's robots.txt asks for, in seconds.
CRAWL_DELAY = 1.0

SITES: tuple[SiteSpec, ...] = (
    SiteSpec(
        "fast.test",
        "healthy and fast",
        "healthy",
        latency=0.05,
        chains=10,
        scope={"concurrency": 6, "delay": 0.0},
    ),
    SiteSpec(
        "busy.test",
        "429 bursts, Retry-After: 2",
        "bursts",
        scope={"concurrency": 2, "delay": 0.2},
        # Overloaded from second 2 to 5 of every 10 (counted from its first page request).
        params={"period": 10.0, "start": 2.0, "length": 3.0, "retry_after": 2.0},
    ),
    SiteSpec(
        "api.test",
        "API quota 10 per 4 s",
        "quota",
        latency=0.03,
        # The quota as the API's documentation states it: slotkit spends it and
        # no more (its RateLimit headers only tighten the count).
        scope={"concurrency": 3, "delay": 0.0, "quota": 10, "window": 4.0},
        params={"quota": 10.0, "window": 4.0},
    ),
    SiteSpec(
        "polite.test",
        f"robots.txt Crawl-delay: {CRAWL_DELAY:g}",
        "crawl_delay",
        chains=3,
        # No delay or concurrency here: slotkit takes both from the site's robots.txt
        # (ROBOTSTXT_OBEY is on). Only the jitter is set, so that the gaps show the
        # Crawl-delay exactly. See robots_fallback() for slotkit versions without it.
        scope={"jitter": 0},
        params={"crawl_delay": CRAWL_DELAY},
    ),
    SiteSpec(
        "flaky.test",
        "random 503s (8%)",
        "flaky",
        # A per-scope backoff curve: 0.5 s, 1 s, 2 s, 4 s at most.
        scope={"concurrency": 3, "delay": 0.1, "backoff": {"min_delay": 0.5, "max_delay": 4.0}},
        params={"rate": 0.08, "seed": 7.0},
    ),
)


def slotkit_applies_crawl_delay() -> bool:
    """Whether this slotkit turns a robots.txt Crawl-delay into scope limits."""
    from slotkit.settings import ThrottlingSettings

    return importlib.util.find_spec("slotkit.robots") is not None and (
        "robots_obey" in getattr(ThrottlingSettings, "__dataclass_fields__", {})
    )


def robots_fallback(spec: SiteSpec) -> dict[str, Any]:
    """The ``THROTTLING_SCOPES`` entry of *spec*, pacing it by hand if slotkit cannot.

    TODO(robots): drop this once every supported slotkit applies Crawl-delay
    (slotkit/robots.py). Without that support the polite site's scope gets its
    Crawl-delay as a configured delay with a concurrency of 1, so the pacing
    still shows in the demo.
    """
    crawl_delay = spec.params.get("crawl_delay")
    if not crawl_delay or slotkit_applies_crawl_delay():
        return dict(spec.scope)
    return {"concurrency": 1, "delay": crawl_delay, **spec.scope}


@implementer(IResolverSimple)
class DemoResolver:
    """Resolves the demo host names (and 127.0.0.1 itself) to 127.0.0.1; nothing else."""

    def __init__(self, hosts: Sequence[str]) -> None:
        self.hosts = frozenset(host.lower() for host in hosts)

    def getHostByName(  # noqa: N802 - Twisted's interface
        self, name: str, timeout: Sequence[int] = ()
    ) -> Deferred[str]:
        if name.lower() in self.hosts or name == LOOPBACK:
            return succeed(LOOPBACK)
        return fail(DNSLookupError(f"the slotkit demo resolves only its own hosts, not {name!r}"))


@dataclass
class Answer:
    """What a site answers to one request."""

    status: int = 200
    body: bytes = b""
    content_type: str = "text/html; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


class _SiteState:
    """The run-time state of one site's behaviour."""

    def __init__(self, spec: SiteSpec) -> None:
        self.spec = spec
        #: When the first page was asked for: the site's bursts and quota windows count from it.
        self.started: float | None = None
        self.served = 0
        self.window_start = 0.0
        self.window_used = 0.0
        self.rng = random.Random(int(spec.params.get("seed", 0)))

    def answer(self, path: str, now: float, port: int) -> Answer:
        spec = self.spec
        if path == "/robots.txt":
            return self._robots()
        page = _page_number(path)
        if page is None:
            return Answer(404, b"not found\n", "text/plain")
        self.served += 1
        if self.started is None:
            self.started = self.window_start = now
        behaviour = spec.behaviour
        if behaviour == "bursts":
            rejected = self._burst(now)
            if rejected is not None:
                return rejected
        elif behaviour == "quota":
            return self._quota(page, now, port)
        elif behaviour == "flaky" and self.rng.random() < spec.params.get("rate", 0.1):
            return Answer(503, b"<html><body>try again</body></html>", delay=spec.latency)
        return Answer(200, _page_html(spec, page, port), delay=spec.latency)

    def _robots(self) -> Answer:
        lines = ["User-agent: *", "Disallow: /private/"]
        crawl_delay = self.spec.params.get("crawl_delay")
        if crawl_delay:
            lines.append(f"Crawl-delay: {crawl_delay:g}")
        return Answer(200, ("\n".join(lines) + "\n").encode(), "text/plain")

    def _burst(self, now: float) -> Answer | None:
        params = self.spec.params
        period = params.get("period", 10.0)
        since = now - (self.started or now) - params.get("start", 0.0)
        if since < 0 or since % period >= params.get("length", 3.0):
            return None
        retry_after = params.get("retry_after", 2.0)
        return Answer(
            429,
            b"<html><body>too busy, come back later</body></html>",
            headers={"Retry-After": str(math.ceil(retry_after))},
            delay=self.spec.latency,
        )

    def _quota(self, page: int, now: float, port: int) -> Answer:
        params = self.spec.params
        quota = params.get("quota", 10.0)
        window = params.get("window", 5.0)
        while now >= self.window_start + window:
            self.window_start += window
            self.window_used = 0.0
        reset = max(1, math.ceil(self.window_start + window - now))
        allowed = self.window_used < quota
        if allowed:
            self.window_used += 1
        remaining = int(max(0.0, quota - self.window_used))
        headers = {
            "RateLimit-Policy": f'"demo";q={quota:g};w={window:g}',
            "RateLimit": f'"demo";r={remaining};t={reset}',
            "X-RateLimit-Limit": f"{quota:g}",
            "X-RateLimit-Remaining": str(remaining),
            "X-RateLimit-Reset": str(reset),
        }
        if not allowed:
            body = json.dumps({"error": "quota exceeded", "retry_in": reset}).encode()
            return Answer(429, body, "application/json", headers, self.spec.latency)
        chains = self.spec.chains
        payload = {
            "item": page,
            "next": f"http://{self.spec.host}:{port}/page/{page + chains}",
        }
        body = json.dumps(payload).encode()
        return Answer(200, body, "application/json", headers, self.spec.latency)


def _page_number(path: str) -> int | None:
    prefix = "/page/"
    if not path.startswith(prefix):
        return None
    try:
        number = int(path[len(prefix) :])
    except ValueError:
        return None
    return number if number >= 0 else None


def _page_html(spec: SiteSpec, page: int, port: int) -> bytes:
    following = page + spec.chains
    return (
        f"<html><head><title>{spec.host} page {page}</title></head><body>"
        f"<h1>{spec.host} - page {page}</h1><p>{spec.label}</p>"
        f'<a rel="next" href="http://{spec.host}:{port}/page/{following}">next</a>'
        "</body></html>"
    ).encode()


class _Root(Resource):
    isLeaf = True

    def __init__(self, owner: DemoServer) -> None:
        super().__init__()
        self._owner = owner

    def render(self, request: server.Request) -> bytes | int:
        return self._owner._render(request)


class _QuietSite(server.Site):
    noisy = False

    def log(self, request: Any) -> None:
        """No access log: the demo prints its own table."""


class DemoServer:
    """The demo sites on one loopback port. ``start()``, crawl, ``stop()``."""

    def __init__(self, reactor: Any, sites: Sequence[SiteSpec] = SITES) -> None:
        self._reactor = reactor
        self.sites = {spec.host: spec for spec in sites}
        self._states: dict[str, _SiteState] = {}
        self._port: Any = None
        self._pending: set[IDelayedCall] = set()
        self.port = 0

    def start(self, port: int = 0) -> int:
        """Listen on 127.0.0.1 (*port* 0: any free port); return the port."""
        self._states = {host: _SiteState(spec) for host, spec in self.sites.items()}
        listening = self._reactor.listenTCP(port, _QuietSite(_Root(self)), interface=LOOPBACK)
        self._port = listening
        self.port = int(listening.getHost().port)
        return self.port

    def stop(self) -> Deferred[None] | None:
        """Stop listening and drop answers still waiting for their latency."""
        for call in list(self._pending):
            if call.active():
                call.cancel()
        self._pending.clear()
        port, self._port = self._port, None
        if port is None:
            return None
        result: Deferred[None] | None = port.stopListening()
        return result

    def url(self, host: str, path: str = "/") -> str:
        return f"http://{host}:{self.port}{path}"

    def served(self, host: str) -> int:
        """Pages (not robots.txt) *host* was asked for so far."""
        state = self._states.get(host)
        return 0 if state is None else state.served

    def _render(self, request: server.Request) -> bytes | int:
        host = (request.getRequestHostname() or b"").decode("ascii", "replace").lower()
        path = (request.path or b"/").decode("utf-8", "replace")
        state = self._states.get(host)
        if state is None:
            request.setResponseCode(404)
            return b"unknown demo host\n"
        answer = state.answer(path, self._reactor.seconds(), self.port)
        if answer.delay <= 0:
            return self._write(request, answer)
        calls: list[IDelayedCall] = []

        def respond() -> None:
            self._pending.difference_update(calls)
            if not finished:
                request.write(self._write(request, answer))
                request.finish()

        finished: list[bool] = []
        request.notifyFinish().addBoth(lambda _: finished.append(True))
        call = self._reactor.callLater(answer.delay, respond)
        calls.append(call)
        self._pending.add(call)
        return server.NOT_DONE_YET

    @staticmethod
    def _write(request: server.Request, answer: Answer) -> bytes:
        request.setResponseCode(answer.status)
        request.setHeader(b"Content-Type", answer.content_type.encode())
        for name, value in answer.headers.items():
            request.setHeader(name.encode(), value.encode())
        return answer.body
