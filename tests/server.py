"""A loopback-only Twisted web server for slotkit's integration tests.

The server listens on one port shared by several loopback addresses
(127.0.0.1, 127.0.0.2, ... all inside 127.0.0.0/8), so a crawl can address
several distinct "hosts" (``http://127.0.0.2:PORT/...``) and Scrapy opens
separate connections to each of them. ``localhost`` reaches the 127.0.0.1
listener. Every request is recorded per *Host header* hostname, so names
mapped to a loopback address by a test resolver are recorded under their own
name too.

Nothing here imports ``twisted.internet.reactor`` at module import time, so
the module is safe to import before a reactor is installed (see
``tests/crawl.py``'s subprocess runner).

Resources (paths are the same for every host):

``/page/<n>``
    Small HTML page. Query: ``links=N`` renders N child links
    ``/page/<n*N+i>`` (i = 1..N, a heap-numbered tree, so every page number is
    reached exactly once); ``max=M`` omits children numbered >= M;
    ``depth=D`` renders links only while D > 0 (children get D-1);
    ``hosts=h1,h2`` spreads children over those hosts (absolute links);
    ``size=BYTES`` pads the body; ``delay=SECONDS`` answers later.
``/status/<code>``
    Answers ``<code>``. Query: ``retry_after=`` (Retry-After, passed through
    verbatim: seconds or an HTTP-date), ``ratelimit_reset=`` (RateLimit-Reset),
    ``h=Name:Value`` (any extra header, repeatable), ``delay=``.
``/redirect?to=URL``
    302 (or ``status=301/303/307/308``) to URL; ``delay=`` supported.
``/drop``
    Sends headers announcing a longer body, a partial body, then closes the
    connection. ``mode=lose`` (default, clean FIN after flushing) or
    ``mode=abort`` (reset); ``after=SECONDS`` waits before cutting.
``/hang``
    Never answers (until the client gives up or the site stops).
``/echo``
    JSON with the request's method, host, path, headers; ``delay=``.
``/robots.txt``
    Per host text set with :meth:`MockSite.set_robots`; 404 by default.

A per-host *behaviour* (:meth:`MockSite.set_behaviour`) is consulted before
the resources above (except robots.txt) and may answer the request itself.

:meth:`MockSite.restart` takes the whole site down (connections reset, new
ones refused) and brings it back on the same port after a pause.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, cast
from urllib.parse import quote, urlencode

from twisted.internet.defer import Deferred, succeed
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IDelayedCall, IListeningPort
from twisted.web import server
from twisted.web.http import HTTPChannel
from twisted.web.resource import Resource

DEFAULT_HOSTS: tuple[str, ...] = ("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4")


class _Reactor(Protocol):
    """The reactor features this module uses (IReactorTCP + IReactorTime)."""

    def listenTCP(
        self, port: int, factory: Any, backlog: int = ..., interface: str = ...
    ) -> IListeningPort: ...

    def callLater(
        self, delay: float, callable: Callable[..., Any], *args: Any, **kw: Any
    ) -> IDelayedCall: ...

    def seconds(self) -> float: ...


def _default_reactor() -> _Reactor:
    from twisted.internet import reactor

    return cast(_Reactor, reactor)


# --------------------------------------------------------------------------
# Recording
# --------------------------------------------------------------------------


@dataclass
class RequestRecord:
    """One request as seen by the server."""

    host: str
    """Hostname from the Host header, lower-case, without port."""
    path: str
    """Path without the query string."""
    uri: str
    """Path with the query string, as sent."""
    method: str
    arrived: float
    """reactor.seconds() when the request was fully received."""
    seq: int
    """0-based index of this request among all requests to ``host``."""
    finished: float | None = None
    """When the response was finished or the connection was lost."""
    status: int | None = None
    lost: bool = False
    """True if the connection went away before the response was finished."""
    headers: dict[str, str] = field(default_factory=dict)


class Recorder:
    """Logs every request and tracks how many are in flight per host.

    A request is *in flight* from its arrival until its response is finished
    or its connection is lost.
    """

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Forget everything recorded so far."""
        self.records: list[RequestRecord] = []
        self.in_flight: dict[str, int] = {}
        self.max_in_flight: dict[str, int] = {}
        self.total_in_flight = 0
        self.max_total_in_flight = 0
        self._per_host_count: dict[str, int] = {}

    # -- mutation (used by the server) ------------------------------------

    def arrive(self, record: RequestRecord) -> None:
        self.records.append(record)
        host = record.host
        current = self.in_flight.get(host, 0) + 1
        self.in_flight[host] = current
        self.max_in_flight[host] = max(self.max_in_flight.get(host, 0), current)
        self.total_in_flight += 1
        self.max_total_in_flight = max(self.max_total_in_flight, self.total_in_flight)

    def depart(self, record: RequestRecord, when: float, lost: bool) -> None:
        if record.finished is not None:
            return
        record.finished = when
        record.lost = lost
        if record not in self.records:  # recorded before clear()
            return
        self.in_flight[record.host] -= 1
        self.total_in_flight -= 1

    def next_seq(self, host: str) -> int:
        n = self._per_host_count.get(host, 0)
        self._per_host_count[host] = n + 1
        return n

    # -- queries ------------------------------------------------------------

    def hosts(self) -> list[str]:
        return sorted({r.host for r in self.records})

    def for_host(self, host: str, path_prefix: str | None = None) -> list[RequestRecord]:
        return [
            r
            for r in self.records
            if r.host == host and (path_prefix is None or r.path.startswith(path_prefix))
        ]

    def count(self, host: str | None = None, path_prefix: str | None = None) -> int:
        return sum(
            1
            for r in self.records
            if (host is None or r.host == host)
            and (path_prefix is None or r.path.startswith(path_prefix))
        )

    def paths(self, host: str | None = None) -> list[str]:
        return [r.path for r in self.records if host is None or r.host == host]

    def arrivals(self, host: str | None = None, path_prefix: str | None = None) -> list[float]:
        """Arrival times (sorted) of requests to ``host`` (all hosts if None)."""
        return sorted(
            r.arrived
            for r in self.records
            if (host is None or r.host == host)
            and (path_prefix is None or r.path.startswith(path_prefix))
        )

    def gaps(self, host: str | None = None, path_prefix: str | None = None) -> list[float]:
        """Differences between consecutive arrivals."""
        times = self.arrivals(host, path_prefix)
        return [b - a for a, b in itertools.pairwise(times)]

    def max_concurrency(self, hosts: Iterable[str] | None = None) -> int:
        """Highest number of simultaneously open requests over ``hosts``.

        Computed from the recorded intervals, so it also works for a *group*
        of hosts (e.g. a throttling scope shared by two hosts). Requests still
        open count as open until the end of time. A request finishing at the
        exact instant another arrives is not counted as overlapping it.
        """
        wanted = None if hosts is None else set(hosts)
        events: list[tuple[float, int]] = []
        for r in self.records:
            if wanted is not None and r.host not in wanted:
                continue
            events.append((r.arrived, 1))
            if r.finished is not None:
                events.append((r.finished, -1))
        # departures (-1) sort before arrivals (+1) at the same instant
        events.sort()
        best = cur = 0
        for _, delta in events:
            cur += delta
            best = max(best, cur)
        return best

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable snapshot."""
        return {
            "records": [asdict(r) for r in self.records],
            "in_flight": dict(self.in_flight),
            "max_in_flight": dict(self.max_in_flight),
            "total_in_flight": self.total_in_flight,
            "max_total_in_flight": self.max_total_in_flight,
        }


# --------------------------------------------------------------------------
# Behaviours
# --------------------------------------------------------------------------


@dataclass
class Reply:
    """What a behaviour answers instead of the normal resource."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | str = b""
    delay: float = 0.0


ReplyLike = Reply | tuple[int, dict[str, str], bytes | str, float]
Behaviour = Callable[[server.Request, int], ReplyLike | None]
"""``fn(request, n)`` where ``n`` is the 0-based index of the request among
those this behaviour has seen; return ``None`` to fall through to the normal
resource tree."""


def fail_first(
    count: int,
    status: int = 429,
    headers: dict[str, str] | None = None,
    delay: float = 0.0,
) -> Behaviour:
    """Answer ``status`` to the first ``count`` requests, then behave normally."""

    def behaviour(request: server.Request, n: int) -> Reply | None:
        if n < count:
            return Reply(status, dict(headers or {}), f"status {status}".encode(), delay)
        return None

    return behaviour


def random_failures(
    rate: float,
    status: int = 429,
    seed: int = 0,
    headers: dict[str, str] | None = None,
    delay: float = 0.0,
) -> Behaviour:
    """Answer ``status`` to a seeded-random ``rate`` fraction of requests."""
    rng = random.Random(seed)

    def behaviour(request: server.Request, n: int) -> Reply | None:
        if rng.random() < rate:
            return Reply(status, dict(headers or {}), f"status {status}".encode(), delay)
        return None

    return behaviour


def always(
    status: int = 429, headers: dict[str, str] | None = None, delay: float = 0.0
) -> Behaviour:
    """Answer ``status`` to every request."""
    return fail_first(2**62, status, headers, delay)


# --------------------------------------------------------------------------
# Resource tree
# --------------------------------------------------------------------------


def _arg(request: server.Request, name: str, default: str | None = None) -> str | None:
    values = (request.args or {}).get(name.encode())
    if not values:
        return default
    return cast(bytes, values[0]).decode("utf-8", "replace")


def _args(request: server.Request, name: str) -> list[str]:
    values = (request.args or {}).get(name.encode()) or []
    return [cast(bytes, v).decode("utf-8", "replace") for v in values]


def _float_arg(request: server.Request, name: str, default: float = 0.0) -> float:
    value = _arg(request, name)
    return default if value is None else float(value)


class _Root(Resource):
    """Single leaf resource that dispatches on the path itself."""

    isLeaf = True

    def __init__(self, site: MockSite) -> None:
        super().__init__()
        self._site = site

    def render(self, request: server.Request) -> bytes | int:
        return self._site._handle(request)


class _Site(server.Site):
    """twisted.web Site that stays quiet and remembers its connections."""

    noisy = False

    def __init__(self, resource: Resource, owner: MockSite) -> None:
        super().__init__(resource)
        self._owner = owner

    def log(self, request: Any) -> None:  # no access log
        pass

    def buildProtocol(self, addr: Any) -> Any:
        proto = super().buildProtocol(addr)
        if proto is not None:
            self._owner._channels.add(proto)
        return proto


# --------------------------------------------------------------------------
# MockSite
# --------------------------------------------------------------------------


class MockSite:
    """The test web server. Create, ``await site.start()``, use, ``await site.stop()``."""

    def __init__(
        self, hosts: Sequence[str] = DEFAULT_HOSTS, reactor: _Reactor | None = None
    ) -> None:
        for h in hosts:
            if not h.startswith("127."):
                raise ValueError(f"only 127.0.0.0/8 addresses may be bound, got {h!r}")
        self.hosts: tuple[str, ...] = tuple(hosts)
        self._reactor = reactor
        self.recorder = Recorder()
        self.port: int = 0
        self._ports: list[IListeningPort] = []
        self._behaviours: dict[str, tuple[Behaviour, str | None]] = {}
        self._behaviour_counts: dict[str, int] = {}
        self._robots: dict[str, str] = {}
        self._pending: set[IDelayedCall] = set()
        self._channels: set[HTTPChannel] = set()
        self._restarting: Deferred[None] | None = None
        self._site = _Site(_Root(self), self)

    @property
    def reactor(self) -> _Reactor:
        if self._reactor is None:
            self._reactor = _default_reactor()
        return self._reactor

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> Deferred[MockSite]:
        """Bind every address on one shared ephemeral port."""
        if self._ports:
            raise RuntimeError("MockSite already started")
        last_error: Exception | None = None
        for _ in range(20):
            ports: list[IListeningPort] = []
            try:
                first = self.reactor.listenTCP(0, self._site, interface=self.hosts[0])
                ports.append(first)
                port = first.getHost().port  # type: ignore[attr-defined]
                for host in self.hosts[1:]:
                    ports.append(self.reactor.listenTCP(port, self._site, interface=host))
            except CannotListenError as exc:  # port taken on another address
                last_error = exc
                for p in ports:
                    p.stopListening()
                continue
            self._ports = ports
            self.port = port
            return succeed(self)
        raise RuntimeError(f"could not bind a shared port on {self.hosts}: {last_error}")

    def stop(self) -> Deferred[None]:
        """Stop listening, cancel pending delayed answers, drop open connections."""
        self._restarting = None
        return self._go_down()

    def restart(self, downtime: float) -> Deferred[None]:
        """Act like a restarted server: gone now, back on the same port after ``downtime`` s.

        Open connections are aborted (requests in flight see a reset), delayed
        answers are cancelled and the listening ports closed, so new
        connections are refused; then every address listens on :attr:`port`
        again. The Deferred fires once it does (never, if :meth:`stop` comes
        first). The recorder keeps counting across the restart.
        """
        if not self._ports:
            raise RuntimeError("MockSite is not running")
        back: Deferred[None] = Deferred()
        self._restarting = back

        def relisten() -> None:
            if self._restarting is not back:  # stopped meanwhile
                return
            self._restarting = None
            self._ports = [
                self.reactor.listenTCP(self.port, self._site, interface=host) for host in self.hosts
            ]
            back.callback(None)

        def down(_: object) -> None:
            if self._restarting is back:
                self._later(downtime, relisten, [])

        self._go_down().addCallback(down)
        return back

    def _go_down(self) -> Deferred[None]:
        for call in list(self._pending):
            if call.active():
                call.cancel()
        self._pending.clear()
        for channel in list(self._channels):
            # Site builds a _GenericHTTPChannelProtocol; the HTTPChannel with
            # the transport is inside it.
            channel = getattr(channel, "_channel", channel)
            transport = getattr(channel, "transport", None)
            if transport is not None and getattr(channel, "connected", False):
                transport.abortConnection()
        self._channels.clear()
        ports, self._ports = self._ports, []
        ds = [d for p in ports if (d := p.stopListening()) is not None]
        from twisted.internet.defer import gatherResults

        result: Deferred[None] = gatherResults(ds).addCallback(lambda _: None)
        return result

    # -- configuration --------------------------------------------------------

    def url(self, host: str = "127.0.0.1", path: str = "/", **query: Any) -> str:
        """``http://host:PORT/path`` (``path`` may already contain a query;
        ``query`` kwargs are appended url-encoded)."""
        if not path.startswith("/"):
            path = "/" + path
        url = f"http://{host}:{self.port}{path}"
        if query:
            url += ("&" if "?" in path else "?") + urlencode(query, doseq=True)
        return url

    def set_behaviour(
        self, host: str, fn: Behaviour | None, path_prefix: str | None = None
    ) -> None:
        """Install (or with ``None`` remove) a behaviour for ``host``.

        It is consulted for every request to ``host`` whose path starts with
        ``path_prefix`` (any path if None), except ``/robots.txt``.
        """
        host = host.lower()
        if fn is None:
            self._behaviours.pop(host, None)
        else:
            self._behaviours[host] = (fn, path_prefix)
        self._behaviour_counts[host] = 0

    def configure(self, spec: Mapping[str, Any]) -> None:
        """Apply a JSON-able description (used by the subprocess crawl runner)::

            {"robots": {"127.0.0.2": "User-agent: *\\nDisallow: /"},
             "behaviours": {"127.0.0.1": {"fail_first": {"count": 3, "status": 429}},
                            "127.0.0.3": {"random_failures": {"rate": 0.3}},
                            "127.0.0.4": {"always": {"status": 503}}}}

        A behaviour entry may also carry ``"path_prefix"``.
        """
        factories: dict[str, Callable[..., Behaviour]] = {
            "fail_first": fail_first,
            "random_failures": random_failures,
            "always": always,
        }
        for host, text in (spec.get("robots") or {}).items():
            self.set_robots(host, text)
        for host, entry in (spec.get("behaviours") or {}).items():
            entry = dict(entry)
            prefix = entry.pop("path_prefix", None)
            ((kind, kwargs),) = entry.items()
            self.set_behaviour(host, factories[kind](**kwargs), path_prefix=prefix)

    def set_robots(self, host: str, text: str | None) -> None:
        """Serve ``text`` as /robots.txt on ``host`` (``None``: 404)."""
        if text is None:
            self._robots.pop(host.lower(), None)
        else:
            self._robots[host.lower()] = text

    # -- request handling -----------------------------------------------------

    def _handle(self, request: server.Request) -> bytes | int:
        host = request.getRequestHostname().decode("ascii", "replace").lower()
        path = request.path.decode("utf-8", "replace")
        record = RequestRecord(
            host=host,
            path=path,
            uri=request.uri.decode("utf-8", "replace"),
            method=request.method.decode("ascii", "replace"),
            arrived=self.reactor.seconds(),
            seq=self.recorder.next_seq(host),
            headers={
                k.decode("latin-1"): vs[0].decode("latin-1")
                for k, vs in request.requestHeaders.getAllRawHeaders()
                if vs
            },
        )
        self.recorder.arrive(record)
        delayed: list[IDelayedCall] = []

        def done(_: object) -> None:
            record.status = request.code
            self.recorder.depart(record, self.reactor.seconds(), lost=False)

        def lost(_: object) -> None:
            record.status = None
            self.recorder.depart(record, self.reactor.seconds(), lost=True)
            for call in delayed:
                if call.active():
                    call.cancel()
                self._pending.discard(call)

        request.notifyFinish().addCallbacks(done, lost)

        if path != "/robots.txt" and host in self._behaviours:
            fn, prefix = self._behaviours[host]
            if prefix is None or path.startswith(prefix):
                n = self._behaviour_counts.get(host, 0)
                self._behaviour_counts[host] = n + 1
                reply = fn(request, n)
                if reply is not None:
                    if isinstance(reply, tuple):
                        reply = Reply(*reply)
                    body = reply.body.encode() if isinstance(reply.body, str) else reply.body
                    return self._answer(
                        request, delayed, reply.status, reply.headers, body, reply.delay
                    )

        return self._dispatch(request, host, path, delayed)

    def _dispatch(
        self, request: server.Request, host: str, path: str, delayed: list[IDelayedCall]
    ) -> bytes | int:
        parts = [p for p in path.split("/") if p]
        head = parts[0] if parts else ""
        delay = _float_arg(request, "delay")
        html = {"Content-Type": "text/html; charset=utf-8"}

        if path == "/robots.txt":
            text = self._robots.get(host)
            if text is None:
                return self._answer(request, delayed, 404, {}, b"no robots.txt", 0.0)
            return self._answer(
                request,
                delayed,
                200,
                {"Content-Type": "text/plain"},
                text.encode(),
                0.0,
            )
        if head == "page" and len(parts) == 2 and parts[1].isdigit():
            return self._answer(
                request,
                delayed,
                200,
                html,
                self._page_body(request, host, int(parts[1])),
                delay,
            )
        if head == "status" and len(parts) == 2 and parts[1].isdigit():
            code = int(parts[1])
            headers: dict[str, str] = {}
            if (ra := _arg(request, "retry_after")) is not None:
                headers["Retry-After"] = ra
            if (rr := _arg(request, "ratelimit_reset")) is not None:
                headers["RateLimit-Reset"] = rr
            for spec in _args(request, "h"):
                name, _, value = spec.partition(":")
                headers[name.strip()] = value.strip()
            return self._answer(request, delayed, code, headers, f"status {code}".encode(), delay)
        if path == "/redirect":
            target = _arg(request, "to")
            if target is None:
                return self._answer(request, delayed, 400, {}, b"missing ?to=", 0.0)
            code = int(_arg(request, "status", "302") or 302)
            return self._answer(request, delayed, code, {"Location": target}, b"redirecting", delay)
        if path == "/drop":
            self._drop(request, delayed)
            return server.NOT_DONE_YET
        if path == "/hang":
            return server.NOT_DONE_YET
        if path == "/echo":
            payload = {
                "method": request.method.decode(),
                "host": host,
                "path": path,
                "uri": request.uri.decode(),
                "headers": {
                    k.decode("latin-1"): [x.decode("latin-1") for x in v]
                    for k, v in request.requestHeaders.getAllRawHeaders()
                },
            }
            return self._answer(
                request,
                delayed,
                200,
                {"Content-Type": "application/json"},
                json.dumps(payload).encode(),
                delay,
            )
        return self._answer(request, delayed, 404, {}, b"not found", 0.0)

    def _page_body(self, request: server.Request, host: str, n: int) -> bytes:
        links = int(_arg(request, "links", "0") or 0)
        max_n = _arg(request, "max")
        depth_arg = _arg(request, "depth")
        hosts_arg = _arg(request, "hosts")
        size = int(_arg(request, "size", "0") or 0)
        link_hosts = [h for h in (hosts_arg or "").split(",") if h]

        anchors: list[str] = []
        if links > 0 and (depth_arg is None or int(depth_arg) > 0):
            # children keep the query, with depth decremented
            query: list[tuple[str, str]] = []
            for key, values in (request.args or {}).items():
                k = cast(bytes, key).decode()
                if k == "depth":
                    continue
                query.extend((k, cast(bytes, v).decode()) for v in values)
            if depth_arg is not None:
                query.append(("depth", str(int(depth_arg) - 1)))
            qs = urlencode(query)
            for i in range(1, links + 1):
                child = n * links + i
                if max_n is not None and child >= int(max_n):
                    break
                rel = f"/page/{child}" + (f"?{qs}" if qs else "")
                href = self.url(link_hosts[child % len(link_hosts)], rel) if link_hosts else rel
                anchors.append(f'<a href="{quote(href, safe=":/?&=,%")}">page {child}</a>')
        body = (
            "<!DOCTYPE html><html><head><title>page {n}</title></head><body>"
            "<p>page {n} on {host}</p>{links}{pad}</body></html>"
        ).format(n=n, host=host, links="".join(anchors), pad="x" * size)
        return body.encode()

    def _answer(
        self,
        request: server.Request,
        delayed: list[IDelayedCall],
        status: int,
        headers: dict[str, str],
        body: bytes,
        delay: float,
    ) -> bytes | int:
        def write() -> None:
            request.setResponseCode(status)
            for name, value in headers.items():
                request.setHeader(name, value)
            if body:
                request.write(body)
            request.finish()

        if delay <= 0:
            request.setResponseCode(status)
            for name, value in headers.items():
                request.setHeader(name, value)
            return body
        self._later(delay, write, delayed)
        return server.NOT_DONE_YET

    def _later(self, delay: float, fn: Callable[[], None], delayed: list[IDelayedCall]) -> None:
        call: IDelayedCall

        def run() -> None:
            self._pending.discard(call)
            fn()

        call = self.reactor.callLater(delay, run)
        delayed.append(call)
        self._pending.add(call)

    def _drop(self, request: server.Request, delayed: list[IDelayedCall]) -> None:
        mode = _arg(request, "mode", "lose")
        after = _float_arg(request, "after", 0.0)
        request.setResponseCode(200)
        request.setHeader("Content-Type", "text/html")
        request.setHeader("Content-Length", "10000")
        request.write(b"<html><body>partial body that never ends")

        def cut() -> None:
            transport = request.channel.transport if request.channel else None
            if transport is None:
                return
            if mode == "abort":
                cast(Any, transport).abortConnection()
            else:
                transport.loseConnection()

        if after > 0:
            self._later(after, cut, delayed)
        else:
            cut()
