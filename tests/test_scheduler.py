"""Unit tests of the throttling-aware scheduler and priority queue, on a Clock.

Two kinds of downloader stand in for the real one: :class:`FakeDownloader`
answers ``time_until_ready`` from a table (to test the queue's choices), and
slotkit's own :class:`~slotkit.Downloader` built on a ``Clock`` (to test that
what the queue hands out really passes the gate at once).
"""

from __future__ import annotations

import itertools
import math
import os
import random
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from scrapy import Request, Spider, signals
from scrapy.dupefilters import RFPDupeFilter
from scrapy.pqueues import DownloaderAwarePriorityQueue, ScrapyPriorityQueue
from scrapy.squeues import FifoMemoryQueue, PickleFifoDiskQueue, PickleLifoDiskQueue
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler
from twisted.internet.task import Clock

from slotkit import pqueue_slot
from slotkit.downloader import Downloader
from slotkit.manager import normalize_scopes
from slotkit.pqueue import DELAYED, ThrottlingAwarePriorityQueue
from slotkit.request_delay import request_delay_left
from slotkit.scheduler import ThrottlingAwareScheduler, check_priority_queue
from slotkit.scope import OPENING_ALLOWANCE, ThrottlingScopeManager
from slotkit.validation import SettingsError

ONE_DELAY = 10.0
SOON = 2.0

IN_MEMORY = {
    "DOWNLOAD_HANDLERS": {
        "http": "slotkit.testing.InMemoryDownloadHandler",
        "https": "slotkit.testing.InMemoryDownloadHandler",
    },
    "RANDOMIZE_DOWNLOAD_DELAY": False,
    "DOWNLOAD_DELAY_JITTER": 0,
}


# ----------------------------------------------------------------------------- fakes


class FakeSlot:
    def __init__(self) -> None:
        self.active: set[Request] = set()


class FakeDownloader:
    """Answers ``time_until_ready`` from ``opens_at`` (slot -> time; ``inf``: full)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.opens_at: dict[str, float] = {}
        self.slots: dict[str, FakeSlot] = {}
        self.active: set[Request] = set()
        self.asked: Counter[str] = Counter()

    def get_slot_key(self, request: Request) -> str:
        return str(request.meta.get("slot") or urlparse_cached(request).hostname)

    def time_until_ready(self, request: Request) -> float:
        key = self.get_slot_key(request)
        self.asked[key] += 1
        opens = self.opens_at.get(key, 0.0)
        return math.inf if math.isinf(opens) else max(0.0, opens - self.clock.seconds())

    def now(self) -> float:
        return self.clock.seconds()

    def delay_left(self, request: Request) -> float:
        return request_delay_left(request, self.clock.seconds())

    def busy(self, slot: str, count: int) -> None:
        self.slots[slot] = FakeSlot()
        self.slots[slot].active = {Request(f"http://{slot}/busy/{i}") for i in range(count)}


class NextCall:
    def __init__(self) -> None:
        self.scheduled = 0

    def schedule(self, delay: float = 0) -> None:
        self.scheduled += 1


def attach_engine(crawler: Any, downloader: Any) -> NextCall:
    nextcall = NextCall()
    crawler.engine = SimpleNamespace(
        downloader=downloader, _slot=SimpleNamespace(nextcall=nextcall)
    )
    return nextcall


def req(host: str, n: int = 0, **kwargs: Any) -> Request:
    return Request(f"http://{host}/{n}", **kwargs)


def make_queue(
    clock: Clock | None = None,
    settings: dict[str, Any] | None = None,
    downloader_cls: type[FakeDownloader] | None = None,
) -> tuple[ThrottlingAwarePriorityQueue, Any, Clock]:
    clock = clock or Clock()
    crawler = get_crawler(settings_dict=settings or {})
    downloader = (downloader_cls or FakeDownloader)(clock)
    attach_engine(crawler, downloader)
    queue = ThrottlingAwarePriorityQueue(crawler, FifoMemoryQueue, "", downloader=downloader)
    return queue, downloader, clock


def url_of(request: Request | None) -> str:
    assert request is not None
    return request.url


def drain(queue: ThrottlingAwarePriorityQueue) -> list[str]:
    urls = []
    while (request := queue.pop_ready()) is not None:
        urls.append(request.url)
    return urls


# ----------------------------------------------------------------------------- the queue


def test_pop_ready_skips_slots_that_must_wait() -> None:
    """A request whose slot must wait stays queued; a ready slot's request is popped."""
    queue, downloader, _ = make_queue()
    downloader.opens_at["slow"] = ONE_DELAY
    queue.push(req("slow", 1))
    queue.push(req("fast", 1))
    assert url_of(queue.pop_ready()) == "http://fast/1"
    assert queue.pop_ready() is None
    assert len(queue) == 1


def test_next_ready_in_names_the_soonest_wait() -> None:
    """The soonest finite wait is reported; a slot full until a download ends reports inf."""
    queue, downloader, clock = make_queue()
    downloader.opens_at.update({"a": ONE_DELAY, "b": SOON, "c": math.inf})
    for host in "abc":
        queue.push(req(host))
    assert queue.next_ready_in() == SOON
    clock.advance(SOON)
    assert queue.next_ready_in() == 0.0
    assert url_of(queue.pop_ready()) == "http://b/0"
    assert queue.next_ready_in() == ONE_DELAY - SOON
    clock.advance(ONE_DELAY)
    queue.pop_ready()
    assert queue.next_ready_in() == math.inf


def test_least_busy_ready_slot_goes_first() -> None:
    """Among ready slots, the one with fewer requests in the downloader goes first."""
    queue, downloader, _ = make_queue()
    downloader.busy("a", 3)
    downloader.busy("b", 1)
    queue.push(req("a"))
    queue.push(req("b"))
    queue.push(req("c"))
    assert drain(queue) == ["http://c/0", "http://b/0", "http://a/0"]


def test_priority_then_fairness_among_equally_busy_slots() -> None:
    """Equally busy: the higher priority first, then the slot served longest ago."""
    queue, _, _ = make_queue()
    queue.push(req("a", 1))
    queue.push(req("a", 2))
    queue.push(req("b", 1))
    queue.push(req("b", 2))
    queue.push(req("c", 1, priority=5))
    order = drain(queue)
    assert order[0] == "http://c/1"
    hosts = [urlparse_cached(Request(u)).hostname for u in order[1:]]
    assert hosts[0] != hosts[1]
    assert hosts[2] != hosts[3]


def test_larger_quota_share_goes_first_when_all_else_is_equal() -> None:
    """A request using more of a scope's remaining quota is preferred (spec: quotas)."""
    queue, downloader, _ = make_queue()
    quotas = {"api-a": 100.0, "api-b": 10.0}

    class Manager:
        def __init__(self, left: float) -> None:
            self.left = left

        def quota_available(self, now: float) -> float:
            return self.left

    downloader.registry = SimpleNamespace(  # type: ignore[attr-defined]
        peek=lambda scope_id: (
            SimpleNamespace(manager=Manager(quotas[scope_id])) if scope_id in quotas else None
        )
    )
    small = req("a", meta={"slot": "a", "throttling_scopes": {"api-a": 20.0}})  # 20 %
    large = req("b", meta={"slot": "b", "throttling_scopes": {"api-b": 5.0}})  # 50 %
    plain = req("c", meta={"slot": "c"})
    for request in (small, plain, large):
        queue.push(request)
    assert queue.quota_share(large) == 0.5
    assert queue.quota_share(plain) == 0.0
    assert [queue.pop_ready() for _ in range(3)] == [large, small, plain]


def test_a_pop_ranks_a_few_slots_not_every_slot_queued() -> None:
    """A perf probe: ranking every slot on each pop cost 15 ms with 10,000 slots queued.

    Counted, not timed: one pop may rank only the slots it must look at.
    """
    queue, downloader, _ = make_queue()
    for host in range(2_000):
        queue.push(req(f"h{host}.test"))
    for host in range(0, 2_000, 2):
        downloader.opens_at[f"h{host}.test"] = ONE_DELAY  # half must wait
    ranked = Counter[str]()
    rank = queue._rank_and_terms

    def counting_rank(slot: str, head: Request) -> Any:
        ranked[slot] += 1
        return rank(slot, head)

    queue._rank_and_terms = counting_rank  # type: ignore[method-assign]
    popped = [queue.pop_ready() for _ in range(100)]
    assert all(request is not None for request in popped)
    assert sum(ranked.values()) < 100 * 10


@pytest.mark.parametrize("seed", range(8))
def test_the_heap_chooses_what_ranking_every_slot_would(seed: int) -> None:
    """Random pushes, waits and time: each pop_ready takes the best ready slot.

    The reference ranks every slot and asks each for readiness, as the queue
    did before it kept its slots in a heap (test_scheduler ran it against
    that queue too).
    """
    rng = random.Random(seed)
    queue, downloader, clock = make_queue()
    hosts = [f"h{i}" for i in range(12)]
    n = itertools.count()
    for _ in range(300):
        action = rng.random()
        if action < 0.45:
            queue.push(req(rng.choice(hosts), next(n), priority=rng.choice([0, 0, 1, 2])))
        elif action < 0.6:
            # Limits only tighten unannounced (a loosened one may go at the
            # remembered time, by design); they loosen when a request leaves.
            host = rng.choice(hosts)
            later = clock.seconds() + rng.choice([0.5, 2.0, math.inf])
            downloader.opens_at[host] = max(downloader.opens_at.get(host, 0.0), later)
        elif action < 0.7:
            clock.advance(rng.choice([0.1, 0.5, 1.0]))
        elif action < 0.75:
            host = rng.choice(hosts)
            if math.isinf(downloader.opens_at.get(host, 0.0)):
                downloader.opens_at[host] = 0.0
            queue.crawler.signals.send_catch_log(
                signals.request_left_downloader, request=req(host), spider=None
            )
        else:
            expected = best_ready(queue, downloader)
            request = queue.pop_ready()
            assert (request.url if request else None) == expected


def best_ready(queue: ThrottlingAwarePriorityQueue, downloader: FakeDownloader) -> str | None:
    """The head of the best-ranked slot whose head could go now, looking at every slot."""
    ready = [
        (queue.rank(slot, queue._head(slot)), slot)
        for slot, sub in queue.pqueues.items()
        if downloader.time_until_ready(sub.peek()) <= 0
        and not queue.readiness.delay_left(sub.peek())
    ]
    return queue._head(min(ready)[1]).url if ready else None


def test_pop_falls_back_to_the_soonest_for_stock_schedulers() -> None:
    """pop() never answers None while requests are queued (Scrapy's scheduler relies on it)."""
    queue, downloader, _ = make_queue()
    downloader.opens_at.update({"a": ONE_DELAY, "b": SOON})
    queue.push(req("a"))
    queue.push(req("b"))
    assert queue.pop_ready() is None
    assert url_of(queue.peek()) == "http://b/0"
    assert url_of(queue.pop()) == "http://b/0"
    assert url_of(queue.pop()) == "http://a/0"
    assert queue.pop() is None


def test_finite_waits_are_not_asked_again_before_they_end() -> None:
    """A slot known to wait 10 s is not re-queried until then (cheap scans, many slots)."""
    queue, downloader, clock = make_queue()
    downloader.opens_at["slow"] = ONE_DELAY
    queue.push(req("slow"))
    for _ in range(5):
        assert queue.pop_ready() is None
    assert downloader.asked["slow"] == 1
    clock.advance(ONE_DELAY)
    assert queue.pop_ready() is not None
    assert downloader.asked["slow"] == 2


def test_full_slots_are_asked_again_after_a_download_leaves() -> None:
    """inf is trusted until a request leaves the downloader (request_left_downloader)."""
    queue, downloader, _ = make_queue()
    downloader.opens_at["full"] = math.inf
    queue.push(req("full"))
    assert queue.pop_ready() is None
    assert queue.pop_ready() is None
    assert downloader.asked["full"] == 1
    downloader.opens_at["full"] = 0.0
    queue.crawler.signals.send_catch_log(
        signals.request_left_downloader, request=req("other"), spider=None
    )
    assert queue.pop_ready() is not None


def test_a_push_forgets_the_cached_answer_of_its_slot() -> None:
    """A new head (higher priority) is judged afresh."""
    queue, downloader, _ = make_queue()
    downloader.opens_at["s"] = ONE_DELAY
    queue.push(req("s", 1))
    assert queue.pop_ready() is None
    downloader.opens_at["s"] = 0.0
    queue.push(req("s", 2, priority=1))
    assert url_of(queue.pop_ready()) == "http://s/2"


def delayed(host: str, n: int, seconds: float) -> Request:
    return req(host, n, meta={"throttling_delay": seconds})


def test_delayed_requests_wait_in_one_sub_queue_of_their_slot() -> None:
    """A throttling_delay request waits in its slot's delayed sub-queue (one per
    slot, however many due times: a probe opened a file per due second under
    JOBDIR and ran out), and the slot's other requests go meanwhile."""
    queue, _, clock = make_queue()
    for n, seconds in enumerate((SOON, SOON + 1, SOON + 2, SOON + 3)):
        queue.push(delayed("s", n, seconds))
    queue.push(req("s", 9))
    assert sorted(queue.pqueues) == ["s", f"s{DELAYED}"]
    assert url_of(queue.pop_ready()) == "http://s/9"
    assert queue.pop_ready() is None
    assert queue.next_ready_in() == SOON
    clock.advance(SOON)
    assert url_of(queue.pop_ready()) == "http://s/0"
    assert queue.pop_ready() is None
    clock.advance(3)
    assert drain(queue) == ["http://s/1", "http://s/2", "http://s/3"]


def test_a_delayed_sub_queue_is_asked_again_when_its_slot_frees() -> None:
    """A finite "not yet" remembered for a delayed sub-queue ends when a request of
    its slot leaves the downloader, as the slot's own does (it stalled up to 60 s)."""
    queue, downloader, clock = make_queue()
    downloader.opens_at["s"] = ONE_DELAY * 6  # a rampup window's end, say
    queue.push(delayed("s", 1, SOON))
    assert queue.pop_ready() is None
    clock.advance(SOON + 1)
    downloader.opens_at["s"] = 0.0
    queue.crawler.signals.send_catch_log(
        signals.request_left_downloader, request=req("s", 0), spider=None
    )
    assert url_of(queue.pop_ready()) == "http://s/1"


def test_per_ip_concurrency_is_accepted() -> None:
    """CONCURRENT_REQUESTS_PER_IP > 0 works (Scrapy's DownloaderAwarePriorityQueue refuses it)."""
    settings = {"CONCURRENT_REQUESTS_PER_IP": 2}
    queue, _, _ = make_queue(settings=settings)
    queue.push(req("a"))
    assert queue.pop_ready() is not None
    crawler = get_crawler(settings_dict=settings)
    attach_engine(crawler, FakeDownloader(Clock()))
    with pytest.raises(ValueError, match="CONCURRENT_REQUESTS_PER_IP"):
        DownloaderAwarePriorityQueue(crawler, FifoMemoryQueue, "")


def test_peek_agrees_with_pop_for_start_requests() -> None:
    """At one priority, the request peeked (and judged) is the one popped."""
    crawler = get_crawler()
    downloader = FakeDownloader(Clock())
    attach_engine(crawler, downloader)
    queue = ThrottlingAwarePriorityQueue(
        crawler, FifoMemoryQueue, "", start_queue_cls=FifoMemoryQueue, downloader=downloader
    )
    queue.push(req("a", 1, meta={"is_start_request": True}))
    queue.push(req("a", 2))
    assert queue.peek() is queue.pop()


# ----------------------------------------------------------------------------- disk queues


def disk_queue(
    tmp_path: Path, state: Any = None
) -> tuple[ThrottlingAwarePriorityQueue, FakeDownloader]:
    crawler = get_crawler()
    downloader = FakeDownloader(Clock())
    attach_engine(crawler, downloader)
    queue = ThrottlingAwarePriorityQueue(
        crawler, PickleFifoDiskQueue, str(tmp_path), state, downloader=downloader
    )
    return queue, downloader


def test_held_requests_stay_on_disk_across_a_restart(tmp_path: Path) -> None:
    """A held request is simply still queued when the job is closed and resumed."""
    queue, downloader = disk_queue(tmp_path)
    downloader.opens_at["slow"] = ONE_DELAY
    for n in range(3):
        queue.push(req("slow", n))
    queue.push(req("fast"))
    assert url_of(queue.pop_ready()) == "http://fast/0"
    assert queue.pop_ready() is None
    state = queue.close()
    assert list(state) == ["slow"]

    resumed, _ = disk_queue(tmp_path, state)
    assert len(resumed) == 3
    assert [r.url for r in iter(resumed.pop_ready, None)] == [f"http://slow/{n}" for n in range(3)]


def files_open_under(path: Path) -> int:
    """Open file descriptors of this process on files under *path*."""
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if os.path.realpath(fd).startswith(str(path)))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts open files in /proc")
@pytest.mark.parametrize("queue_cls", [PickleFifoDiskQueue, PickleLifoDiskQueue])
def test_a_job_keeps_few_slot_files_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, queue_cls: type
) -> None:
    """One file per slot and priority ran a broad crawl's JOBDIR out of file
    descriptors (30,000 sites queued). Unused slot queues are closed; nothing
    queued is lost or doubled, across a restart too."""
    monkeypatch.setattr(pqueue_slot, "open_queue_limit", lambda: 6)

    def job(state: Any = None) -> ThrottlingAwarePriorityQueue:
        crawler = get_crawler()
        downloader = FakeDownloader(Clock())
        attach_engine(crawler, downloader)
        return ThrottlingAwarePriorityQueue(
            crawler, queue_cls, str(tmp_path), state, downloader=downloader
        )

    queue = job()
    urls = set()
    for n in range(3):
        for site in range(40):
            request = req(f"s{site}", n, priority=n % 2)
            queue.push(request)
            urls.add(request.url)
    assert files_open_under(tmp_path) <= 6
    assert len(queue) == 120
    popped = [queue.pop_ready() for _ in range(50)]
    assert files_open_under(tmp_path) <= 6
    state = queue.close()
    assert files_open_under(tmp_path) == 0

    resumed = job(state)
    assert files_open_under(tmp_path) <= 6
    assert len(resumed) == 70
    popped += list(iter(resumed.pop_ready, None))
    assert sorted(r.url for r in popped if r is not None) == sorted(urls)
    resumed.close()
    assert files_open_under(tmp_path) == 0


def test_a_push_after_a_peek_keeps_a_lifo_disk_queue_whole(tmp_path: Path) -> None:
    """queuelib's LifoDiskQueue.peek leaves its file short of the end: a push after
    it wrote over the last record's length, and the job's queue broke (OSError 22 on
    every pop; a probe's JOBDIR crawls hung). Scrapy's default disk queue is LIFO."""
    crawler = get_crawler()
    downloader = FakeDownloader(Clock())
    attach_engine(crawler, downloader)
    queue = ThrottlingAwarePriorityQueue(
        crawler, PickleLifoDiskQueue, str(tmp_path), None, downloader=downloader
    )
    downloader.opens_at["slow"] = ONE_DELAY
    queue.push(req("slow", 1))
    assert queue.pop_ready() is None  # peeked at its head
    queue.push(req("slow", 2))
    downloader.opens_at["slow"] = 0.0
    assert sorted(url_of(queue.pop()) for _ in range(2)) == ["http://slow/1", "http://slow/2"]
    queue.close()


def test_resumes_a_job_of_downloader_aware_priority_queue(tmp_path: Path) -> None:
    """Scrapy's default queue writes the same layout; its job directory resumes as is."""
    crawler = get_crawler()
    downloader = FakeDownloader(Clock())
    attach_engine(crawler, downloader)
    stock = DownloaderAwarePriorityQueue(crawler, PickleFifoDiskQueue, str(tmp_path))
    for host in ("a", "b"):
        stock.push(req(host))
    state = stock.close()
    resumed, _ = disk_queue(tmp_path, state)
    assert sorted(r.url for r in iter(resumed.pop_ready, None)) == ["http://a/0", "http://b/0"]


def test_an_unserializable_request_leaves_no_empty_slot(tmp_path: Path) -> None:
    """The disk queue refuses it (the scheduler then uses memory); the queue stays sound."""
    queue, _ = disk_queue(tmp_path)
    # Python 3.13 says "Can't get local object ..." without naming pickle.
    with pytest.raises(ValueError, match=r"serialize|pickle|local object"):
        queue.push(req("a", meta={"bad": lambda: None}))
    assert len(queue) == 0
    assert "a" not in queue
    assert queue.pop_ready() is None


def test_a_job_directory_that_cannot_take_a_request_leaves_it_to_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of file descriptors (or disk): an OSError ended the engine's loop;
    a ValueError has Scrapy's scheduler keep the request in memory."""
    queue, _ = disk_queue(tmp_path)

    def no_files(slot: str, startprios: Any = ()) -> Any:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(queue, "pqfactory", no_files)
    with pytest.raises(ValueError, match=r"job directory could not take it .*Too many open files"):
        queue.push(req("a"))
    assert "a" not in queue
    assert queue.pop_ready() is None


def test_a_saved_slot_with_nothing_left_is_dropped(tmp_path: Path) -> None:
    """A slot named in the saved state but empty on disk does not break the queue."""
    resumed, _ = disk_queue(tmp_path, {"gone": [0], "b": []})
    assert len(resumed) == 0
    assert resumed.pop_ready() is None
    assert resumed.next_ready_in() == math.inf


def test_resumes_a_job_of_scrapy_priority_queue(tmp_path: Path) -> None:
    """A list-shaped state (ScrapyPriorityQueue) is moved into per-slot queues."""
    crawler = get_crawler()
    flat = ScrapyPriorityQueue(crawler, PickleFifoDiskQueue, str(tmp_path))
    for n, host in enumerate(["a", "b", "a"]):
        flat.push(req(host, n, priority=n))
    state = flat.close()
    resumed, _ = disk_queue(tmp_path, state)
    assert sorted(resumed.pqueues) == ["a", "b"]
    assert len(resumed) == 3


def test_unknown_saved_state_is_refused(tmp_path: Path) -> None:
    """A state no known queue writes gives an error that says what to do."""
    with pytest.raises(ValueError, match="SCHEDULER_PRIORITY_QUEUE it was started with"):
        disk_queue(tmp_path, ["x"])


# ------------------------------------------------------------------- with slotkit's downloader


class Engine:
    """Plays the engine's part: fetch (downloader.active + the gate), finish."""

    def __init__(self, crawler: Any, downloader: Downloader) -> None:
        self.crawler = crawler
        self.downloader = downloader
        self.tickets: dict[Request, Any] = {}

    def fetch(self, request: Request | None) -> None:
        assert request is not None
        self.downloader.active.add(request)

    def arrive(self, request: Request | None) -> None:
        assert request is not None
        """The request reaches the gate; it must pass at once."""
        dl = self.downloader
        scopes = normalize_scopes(dl.manager.get_scopes(request))
        self.crawler.signals.send_catch_log(
            signals.request_reached_downloader, request=request, spider=None
        )
        ticket = dl.gate.try_acquire(
            request, [dl.registry.get(s) for s in scopes], list(scopes.values())
        )
        assert ticket is not None, f"{request} had to wait at the gate"
        self.tickets[request] = ticket

    def finish(self, request: Request | None) -> None:
        assert request is not None
        self.downloader.gate.release(self.tickets.pop(request))
        self.downloader.active.discard(request)
        self.crawler.signals.send_catch_log(
            signals.request_left_downloader, request=request, spider=None
        )


def slotkit_setup(
    settings: dict[str, Any],
) -> tuple[Any, Downloader, Engine, NextCall, Clock]:
    clock = Clock()
    clock.advance(1000.0)
    crawler = get_crawler(settings_dict={**IN_MEMORY, **settings})
    downloader = Downloader(crawler, clock=clock)
    nextcall = attach_engine(crawler, downloader)
    return crawler, downloader, Engine(crawler, downloader), nextcall, clock


def test_what_the_queue_hands_out_passes_the_gate_at_once() -> None:
    """With a 10 s delay on one host, only its first request leaves before the delay ends."""
    crawler, downloader, engine, _, clock = slotkit_setup(
        {"THROTTLING_SCOPES": {"slow.example": {"delay": ONE_DELAY}}}
    )
    queue = ThrottlingAwarePriorityQueue(crawler, FifoMemoryQueue, "", downloader=downloader)
    for n in range(3):
        queue.push(req("slow.example", n))
    first = queue.pop_ready()
    engine.fetch(first)
    assert queue.pop_ready() is None  # in transit to a scope with a delay
    engine.arrive(first)
    engine.finish(first)  # at once: a scope's first gap runs from its end
    assert queue.pop_ready() is None
    assert queue.next_ready_in() == ONE_DELAY
    clock.advance(ONE_DELAY)
    second = queue.pop_ready()
    engine.fetch(second)
    engine.arrive(second)
    assert url_of(second) == "http://slow.example/1"


def test_a_first_response_slower_than_the_delay_does_not_hold_the_next_one_longer() -> None:
    """The scope's first request still in flight when the delay has run: the queue
    is told to ask again a second later (OPENING_ALLOWANCE). When that request
    ends sooner, its slot is asked afresh: the next request goes a delay after the
    end, not at the remembered time (up to a second late before)."""
    delay, answer = 0.3, 0.5
    crawler, downloader, engine, _, clock = slotkit_setup(
        {"THROTTLING_SCOPES": {"slow.example": {"delay": delay}}}
    )
    queue = ThrottlingAwarePriorityQueue(crawler, FifoMemoryQueue, "", downloader=downloader)
    for n in range(2):
        queue.push(req("slow.example", n))
    first = queue.pop_ready()
    engine.fetch(first)
    engine.arrive(first)
    clock.advance(delay)
    assert queue.pop_ready() is None  # the first is still in flight
    assert queue.next_ready_in() == pytest.approx(OPENING_ALLOWANCE)
    clock.advance(answer - delay)
    engine.finish(first)
    assert queue.next_ready_in() == pytest.approx(delay)
    clock.advance(delay)
    assert url_of(queue.pop_ready()) == "http://slow.example/1"


def test_transit_does_not_block_a_scope_with_room() -> None:
    """No delay and free concurrency: several requests of a host leave in one engine turn."""
    crawler, downloader, engine, _, _ = slotkit_setup({"CONCURRENT_REQUESTS_PER_DOMAIN": 2})
    queue = ThrottlingAwarePriorityQueue(crawler, FifoMemoryQueue, "", downloader=downloader)
    for n in range(3):
        queue.push(req("a.example", n))
    warm = queue.pop_ready()  # the scope is created when the first request arrives
    engine.fetch(warm)
    assert queue.pop_ready() is None
    engine.arrive(warm)
    second = queue.pop_ready()
    engine.fetch(second)
    assert queue.pop_ready() is None  # 1 in flight + 1 in transit = concurrency 2
    engine.arrive(second)
    engine.finish(warm)
    third = queue.pop_ready()
    assert third is not None
    engine.fetch(third)
    engine.arrive(third)


def test_a_request_answered_by_a_middleware_stops_counting_as_in_transit() -> None:
    """A request that leaves downloader.active without reaching the gate is forgotten."""
    crawler, downloader, engine, _, _ = slotkit_setup(
        {"THROTTLING_SCOPES": {"slow.example": {"delay": ONE_DELAY}}}
    )
    queue = ThrottlingAwarePriorityQueue(crawler, FifoMemoryQueue, "", downloader=downloader)
    queue.push(req("slow.example", 1))
    queue.push(req("slow.example", 2))
    cached = queue.pop_ready()
    engine.fetch(cached)
    assert queue.pop_ready() is None
    downloader.active.discard(cached)  # e.g. HttpCacheMiddleware answered it
    assert queue.pop_ready() is not None


def test_per_ip_scope_counts_through_time_until_ready() -> None:
    """Two hosts sharing a scope (as an IP scope would) are held by that scope."""
    crawler, downloader, engine, _, clock = slotkit_setup(
        {
            "THROTTLING_SCOPES": {"10.0.0.1": {"delay": ONE_DELAY}},
            "CONCURRENT_REQUESTS_PER_IP": 1,
            "SCHEDULER_PRIORITY_QUEUE": "slotkit.pqueue.ThrottlingAwarePriorityQueue",
        }
    )
    queue = ThrottlingAwarePriorityQueue(crawler, FifoMemoryQueue, "", downloader=downloader)
    both = {"throttling_scopes": ["a.example", "10.0.0.1"]}
    first = req("a.example", meta=both)
    queue.push(first)
    queue.push(req("b.example", meta={"throttling_scopes": ["b.example", "10.0.0.1"]}))
    queue.push(req("c.example"))
    popped = queue.pop_ready()
    engine.fetch(popped)
    engine.arrive(popped)
    rest = queue.pop_ready()
    assert rest is not None
    assert rest.url == "http://c.example/0"
    engine.fetch(rest)
    engine.arrive(rest)
    assert queue.pop_ready() is None
    engine.finish(popped)
    clock.advance(ONE_DELAY)
    assert queue.pop_ready() is not None


# ----------------------------------------------------------------------------- the scheduler


def make_scheduler(
    settings: dict[str, Any],
) -> tuple[ThrottlingAwareScheduler, Engine, NextCall, Clock]:
    crawler, _downloader, engine, nextcall, clock = slotkit_setup(settings)
    scheduler = ThrottlingAwareScheduler(
        build_from_crawler(RFPDupeFilter, crawler),
        mqclass=FifoMemoryQueue,
        stats=crawler.stats,
        pqclass=ThrottlingAwarePriorityQueue,
        crawler=crawler,
        clock=clock,
    )
    scheduler.open(Spider.from_crawler(crawler, name="t"))
    return scheduler, engine, nextcall, clock


SLOW_HOST = {"THROTTLING_SCOPES": {"slow.example": {"delay": ONE_DELAY}}}


def test_scheduler_holds_back_and_wakes_the_engine_once_when_due() -> None:
    """None while only throttled requests are queued; one timer, at the due time."""
    scheduler, engine, nextcall, clock = make_scheduler(SLOW_HOST)
    for n in range(3):
        scheduler.enqueue_request(req("slow.example", n))
    first = scheduler.next_request()
    engine.fetch(first)
    engine.arrive(first)
    engine.finish(first)  # at once: a scope's first gap runs from its end
    assert scheduler.next_request() is None
    assert scheduler.next_request() is None
    assert scheduler.has_pending_requests()
    assert len(clock.getDelayedCalls()) == 1
    assert clock.getDelayedCalls()[0].getTime() == clock.seconds() + ONE_DELAY
    clock.advance(ONE_DELAY - 0.001)
    assert nextcall.scheduled == 0
    clock.advance(0.001)
    assert nextcall.scheduled == 1
    assert url_of(scheduler.next_request()) == "http://slow.example/1"
    stats = scheduler.stats.get_stats()  # type: ignore[union-attr]
    assert stats["throttling/scheduler/wakeups"] == 1
    assert stats["throttling/scheduler/held_back"] == 2
    scheduler.close("finished")
    assert clock.getDelayedCalls() == []


def test_timer_moves_earlier_but_never_multiplies() -> None:
    """A sooner due time replaces the pending timer; a later one keeps it."""
    settings = {
        "THROTTLING_SCOPES": {
            "slow.example": {"delay": ONE_DELAY},
            "soon.example": {"delay": SOON},
        }
    }
    scheduler, engine, _, clock = make_scheduler(settings)
    for host in ("slow.example", "slow.example", "soon.example", "soon.example"):
        scheduler.enqueue_request(req(host, len(scheduler)))
    for _ in range(2):
        request = scheduler.next_request()
        engine.fetch(request)
        engine.arrive(request)
        engine.finish(request)  # at once: a scope's first gap runs from its end
    assert scheduler.next_request() is None
    calls = clock.getDelayedCalls()
    assert len(calls) == 1
    assert calls[0].getTime() == clock.seconds() + SOON
    scheduler.close("finished")
    assert clock.getDelayedCalls() == []


def test_arrival_of_a_request_in_transit_wakes_a_starved_engine() -> None:
    """Held back only because of a request in transit: its arrival wakes the engine."""
    scheduler, engine, nextcall, _ = make_scheduler({"CONCURRENT_REQUESTS_PER_DOMAIN": 4})
    for n in range(2):
        scheduler.enqueue_request(req("a.example", n))
    first = scheduler.next_request()
    engine.fetch(first)
    assert scheduler.next_request() is None  # the scope does not exist yet
    engine.arrive(first)
    assert nextcall.scheduled == 1
    assert scheduler.next_request() is not None
    scheduler.close("finished")


def test_held_requests_are_not_filtered_again() -> None:
    """The dupefilter sees a request once, however long it is held."""
    scheduler, engine, _, clock = make_scheduler(SLOW_HOST)
    assert scheduler.enqueue_request(req("slow.example", 1))
    assert scheduler.enqueue_request(req("slow.example", 2))
    first = scheduler.next_request()
    engine.fetch(first)
    engine.arrive(first)
    engine.finish(first)
    for _ in range(3):
        assert scheduler.next_request() is None
        clock.advance(1.0)
    clock.advance(ONE_DELAY)
    assert url_of(scheduler.next_request()) == "http://slow.example/2"
    assert not scheduler.enqueue_request(req("slow.example", 2))  # a real duplicate still is
    scheduler.close("finished")


def test_scheduler_replaces_scrapys_queues_and_refuses_others() -> None:
    """Scrapy's priority queues become slotkit's; a queue that cannot hold back is refused."""
    crawler = get_crawler()
    for stock in (ScrapyPriorityQueue, DownloaderAwarePriorityQueue):
        scheduler = ThrottlingAwareScheduler(RFPDupeFilter(), pqclass=stock, crawler=crawler)
        assert scheduler.pqclass is cast(Any, ThrottlingAwarePriorityQueue)

    class Custom(ScrapyPriorityQueue):
        pass

    with pytest.raises(SettingsError, match=r"slotkit\.ThrottlingAwarePriorityQueue"):
        ThrottlingAwareScheduler(RFPDupeFilter(), pqclass=Custom, crawler=crawler)


def test_scheduler_needs_a_throttling_downloader() -> None:
    """With Scrapy's downloader the scheduler says what to set."""
    crawler = get_crawler()
    crawler.engine = cast(Any, SimpleNamespace(downloader=SimpleNamespace()))
    with pytest.raises(SettingsError, match=r"DOWNLOADER = 'slotkit\.Downloader'"):
        ThrottlingAwareScheduler.from_crawler(crawler)


@pytest.mark.parametrize(
    ("settings", "fails"),
    [
        (
            {
                "CONCURRENT_REQUESTS_PER_IP": 2,
                "SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.DownloaderAwarePriorityQueue",
            },
            True,
        ),
        ({"CONCURRENT_REQUESTS_PER_IP": 0}, False),
        (
            {
                "CONCURRENT_REQUESTS_PER_IP": 2,
                "SCHEDULER_PRIORITY_QUEUE": "slotkit.pqueue.ThrottlingAwarePriorityQueue",
            },
            False,
        ),
        (
            {
                "CONCURRENT_REQUESTS_PER_IP": 2,
                "SCHEDULER": "slotkit.scheduler.ThrottlingAwareScheduler",
            },
            False,
        ),
    ],
)
def test_check_priority_queue_names_the_fix(settings: dict[str, Any], fails: bool) -> None:
    """Scrapy's queue, chosen explicitly, with CONCURRENT_REQUESTS_PER_IP: an error naming ours."""
    crawler = get_crawler(settings_dict=settings)
    if fails:
        with pytest.raises(SettingsError, match="SCHEDULER_PRIORITY_QUEUE = 'slotkit"):
            check_priority_queue(crawler.settings)
    else:
        check_priority_queue(crawler.settings)


def test_per_ip_limit_alone_switches_to_the_throttling_queue(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """CONCURRENT_REQUESTS_PER_IP with the queue left at Scrapy's default just works.

    The spec says setting it enables per-IP limits; Scrapy's default queue
    would refuse to open, so slotkit's queue takes its place, with a log line.
    """
    crawler = get_crawler(settings_dict={"CONCURRENT_REQUESTS_PER_IP": 2})
    assert crawler.settings.frozen
    with caplog.at_level("INFO", logger="slotkit"):
        check_priority_queue(crawler.settings)
    assert crawler.settings["SCHEDULER_PRIORITY_QUEUE"] == "slotkit.ThrottlingAwarePriorityQueue"
    assert crawler.settings.frozen
    assert "CONCURRENT_REQUESTS_PER_IP" in caplog.text


# ------------------------------------------------------- quota share with slotkit's manager


class _CountingManager(ThrottlingScopeManager):
    """A custom scope manager (anything but slotkit's default one)."""


def _quota_queue(scopes: dict[str, Any]) -> tuple[ThrottlingAwarePriorityQueue, Downloader]:
    crawler, downloader, _, _, _ = slotkit_setup({"THROTTLING_SCOPES": scopes})
    queue = ThrottlingAwarePriorityQueue(crawler, FifoMemoryQueue, "", downloader=downloader)
    return queue, downloader


def test_the_default_managers_quota_share_ranks_slots() -> None:
    """With slotkit's own manager, before and after the quota scope exists, the request
    using more of what is left goes first, whatever the slot names' order."""
    queue, downloader = _quota_queue({"budget": {"quota": 10.0, "concurrency": 10}})
    small = req("a.example", meta={"throttling_scopes": {"a.example": None, "budget": 1.0}})
    big = req("z.example", meta={"throttling_scopes": {"z.example": None, "budget": 3.0}})
    queue.push(small)
    queue.push(big)
    assert downloader.registry.peek("budget") is None
    assert queue.quota_share(big) == pytest.approx(0.3)
    assert queue.pop_ready() is big
    downloader.registry.get("budget").manager.record_sent(downloader.now(), 6.0)
    assert queue.quota_share(small) == pytest.approx(0.25)  # 1 of the 4 left
    assert queue.pop_ready() is small


def test_a_request_naming_no_amount_spends_one_unit_of_a_quota() -> None:
    """A plain request of a quota scope counts 1 unit, as its manager counts it."""
    queue, _ = _quota_queue({"budget": {"quota": 10.0, "concurrency": 10}})
    plain = req("a.example", meta={"throttling_scopes": ["a.example", "budget"]})
    half = req("z.example", meta={"throttling_scopes": {"z.example": None, "budget": 0.5}})
    queue.push(half)
    queue.push(plain)
    assert queue.quota_share(plain) == pytest.approx(0.1)
    assert queue.pop_ready() is plain


def test_scopes_of_other_managers_get_no_guessed_share() -> None:
    """A scope whose manager is not slotkit's reports no share once alive, so none is
    guessed for it before it exists either."""
    manager = f"{__name__}._CountingManager"
    queue, _ = _quota_queue({"budget": {"quota": 10.0, "manager": manager}})
    request = req("a.example", meta={"throttling_scopes": {"a.example": None, "budget": 3.0}})
    assert queue.quota_share(request) == 0.0


# ------------------------------------------------- the heap, found by a review


def test_quota_share_raised_by_another_slots_spending() -> None:
    """Slots a and b share a 'budget' quota scope. Slot d spends 6 of 10 units;
    then a (2 units) uses 2/4 = 0.5 of what is left, b (1 unit) 1/4: a goes
    first, though it was filed under 2/10 = 0.2."""
    crawler, downloader, engine, _, _ = slotkit_setup(
        {"THROTTLING_SCOPES": {"budget": {"quota": 10.0, "concurrency": 10}}}
    )
    queue = ThrottlingAwarePriorityQueue(crawler, FifoMemoryQueue, "", downloader=downloader)
    scopes = lambda host, amount: {"throttling_scopes": {host: None, "budget": amount}}  # noqa: E731
    queue.push(req("d.example", meta=scopes("d.example", 6.0)))
    queue.push(req("a.example", meta=scopes("a.example", 2.0)))
    d = queue.pop_ready()
    assert d is not None
    assert d.url == "http://d.example/0"
    engine.fetch(d)
    engine.arrive(d)  # the gate counts 6 units of budget
    engine.finish(d)
    queue.push(req("b.example", meta=scopes("b.example", 1.0)))
    # Each host's requests of two scopes have a sub-queue for the pair.
    assert queue.quota_share(queue._head("a.example & budget")) == pytest.approx(0.5)
    assert queue.quota_share(queue._head("b.example & budget")) == pytest.approx(0.25)
    assert queue.pop_ready().url == "http://a.example/0"


def test_busy_of_a_non_primary_scope_drops_unannounced() -> None:
    """x's request also counts in scope a.example (not its primary). When it
    leaves, a.example (priority 5, no longer busy) goes before b.example."""
    crawler, downloader, engine, _, _ = slotkit_setup({})
    queue = ThrottlingAwarePriorityQueue(crawler, FifoMemoryQueue, "", downloader=downloader)
    queue.push(req("x.example", meta={"throttling_scopes": ["x.example", "a.example"]}))
    x = queue.pop_ready()
    engine.fetch(x)
    engine.arrive(x)
    assert queue.busy("a.example") == 1
    queue.push(req("a.example", 1, priority=5))
    queue.push(req("b.example", 1, priority=0))
    engine.finish(x)
    assert queue.busy("a.example") == 0
    assert queue.pop_ready().url == "http://a.example/1"


def test_a_request_held_by_its_second_scope_does_not_hold_back_its_first() -> None:
    """A probe: {"api", "users"} with users paced at 5 s, queued before requests
    of "api" alone, held all of them behind it in api's sub-queue (0 of 10 sent
    in 6 s; Scrapy's own queue sent all). A set of scopes has its own sub-queue."""
    crawler, downloader, engine, _, clock = slotkit_setup(
        {"THROTTLING_SCOPES": {"api": {"concurrency": 8}, "users": {"delay": 5.0}}}
    )
    queue = ThrottlingAwarePriorityQueue(crawler, FifoMemoryQueue, "", downloader=downloader)
    both = {"throttling_scopes": ["api", "users"]}
    for n in range(2):
        queue.push(req("a.example", n, meta=both))
    for n in range(3):
        queue.push(req("a.example", 10 + n, meta={"throttling_scopes": ["api"]}))
    sent = []
    while (request := queue.pop_ready()) is not None:
        engine.fetch(request)
        engine.arrive(request)
        engine.finish(request)
        sent.append(request.url)
    # users lets one through, then paces the second 5 s later; api's own go now.
    assert sorted(sent) == ["http://a.example/0", *(f"http://a.example/{10 + n}" for n in range(3))]
    assert queue.next_ready_in() == pytest.approx(5.0)
    clock.advance(5.0)
    assert url_of(queue.pop_ready()) == "http://a.example/1"


def test_a_sub_queue_whose_head_is_led_by_another_scope_leaves_the_old_leader() -> None:
    """A custom manager may answer another set for the next head of a sub-queue:
    its old leader no longer wakes it, and nothing is left behind once it empties."""
    crawler, downloader, _, _, _ = slotkit_setup({})
    queue = ThrottlingAwarePriorityQueue(crawler, FifoMemoryQueue, "", downloader=downloader)
    slot = "api & users"
    queue.push(req("a.example", 0, meta={"throttling_scopes": ["api", "users"]}))
    queue.push(req("a.example", 1, meta={"throttling_scopes": ["api", "users"]}))
    queue._head(slot)
    assert queue._led == {slot: "api"}
    queue.pqueues[slot].pop()  # the head leaves; the next one's first scope is another
    queue._forget(slot)
    queue._heads.pop(slot, None)
    queue.readiness.scopes = lambda request: {"users": None, "api": None}  # type: ignore[method-assign]
    queue._head(slot)
    assert queue._led == {slot: "users"}
    assert queue._led_by == {"users": {slot}}
    queue._pop_from(slot)
    assert not queue._led
    assert not queue._led_by


@pytest.mark.parametrize(
    ("settings", "meta_scopes", "key"),
    [
        # A review: a Crawl-delay of the site put {site, users} back in the site's,
        # in whatever order, and when the site joined the scope named alone.
        ({"ROBOTSTXT_OBEY": True}, ["s.example.com", "users"], "s.example.com & users"),
        ({"ROBOTSTXT_OBEY": True}, ["users", "s.example.com"], "s.example.com & users"),
        ({"ROBOTSTXT_OBEY": True}, ["users"], "s.example.com & users"),
        # The group a paced site joined follows the site: no set.
        (
            {"ROBOTSTXT_OBEY": True, "THROTTLING_DOMAIN_GROUPING": "registrable_domain"},
            None,
            "s.example.com",
        ),
        # An address the user names is a scope like any other (a review) ...
        ({}, ["api", "10.0.0.5"], "api & 10.0.0.5"),
        # ... while the one CONCURRENT_REQUESTS_PER_IP adds follows the host.
        ({"CONCURRENT_REQUESTS_PER_IP": 2}, None, "s.example.com"),
    ],
)
def test_which_scopes_make_a_sub_queue_of_several(
    settings: dict[str, Any], meta_scopes: list[str] | None, key: str
) -> None:
    from scrapy.resolver import dnscache

    _, downloader, _, _, _ = slotkit_setup(settings)
    if downloader.crawl_delays is not None:
        downloader.crawl_delays.delays["s.example.com"] = 0.5
    meta = {} if meta_scopes is None else {"throttling_scopes": meta_scopes}
    request = Request("http://s.example.com/1", meta=meta)
    dnscache["s.example.com"] = "10.0.0.7"
    try:
        assert len(downloader.known_scopes(request)) == 2
        assert downloader.queue_key(request) == key
    finally:
        del dnscache["s.example.com"]


def test_a_sub_queue_of_several_scopes_ranks_and_wakes_as_its_first() -> None:
    """It is named after no scope: it counts its first scope's busy requests and
    hears of that scope's departures, as a sub-queue under that name would."""
    crawler, downloader, engine, _, _ = slotkit_setup(
        {"THROTTLING_SCOPES": {"api": {"concurrency": 8}}}
    )
    queue = ThrottlingAwarePriorityQueue(crawler, FifoMemoryQueue, "", downloader=downloader)
    queue.push(req("a.example", 0, meta={"throttling_scopes": ["api"]}))
    first = queue.pop_ready()
    engine.fetch(first)
    engine.arrive(first)
    queue.push(req("a.example", 1, meta={"throttling_scopes": ["api", "users"]}))
    slot = "api & users"
    assert slot in queue
    assert queue.rank(slot, queue._head(slot))[0] == 1  # api's request in the downloader
    queue._order.remember_wait(slot, downloader._clock.seconds() + 60.0, 0)
    engine.finish(first)  # api's request leaves: a wait remembered for the set ends
    assert not queue._order.waits_finitely(slot)
    assert queue.rank(slot, queue._head(slot))[0] == 0
    assert url_of(queue.pop_ready()) == "http://a.example/1"
    assert slot not in queue
    assert not queue._led
    assert not queue._led_by


def test_group_slot_not_reoffered_when_a_crawl_delayed_site_request_leaves() -> None:
    """THROTTLING_DOMAIN_GROUPING and a robots.txt Crawl-delay: requests of the
    delayed site s.example.com sit in slot 's.example.com' but also count in the
    group scope 'example.com'; one leaving must refile the group's slot too."""
    crawler, downloader, engine, _, _ = slotkit_setup(
        {
            "THROTTLING_DOMAIN_GROUPING": "registrable_domain",
            "ROBOTSTXT_OBEY": True,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
        }
    )
    downloader.crawl_delays.delays["s.example.com"] = 0.5
    queue = ThrottlingAwarePriorityQueue(crawler, FifoMemoryQueue, "", downloader=downloader)
    queue.push(req("s.example.com", 1))
    s1 = queue.pop_ready()
    assert s1 is not None
    engine.fetch(s1)
    engine.arrive(s1)
    assert queue.busy("example.com") == 1
    queue.push(req("www.example.com", 1, priority=5))  # slot: group example.com
    queue.push(req("other.org", 1, priority=0))
    engine.finish(s1)
    assert queue.busy("example.com") == 0
    assert queue.pop_ready().url == "http://www.example.com/1"


# ---------------------------------------------------------------- stalls


class FlakyDownloader(FakeDownloader):
    """time_until_ready raises once for one host (a custom scope manager's hiccup)."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.fail_once: set[str] = set()

    def time_until_ready(self, request: Request) -> float:
        key = self.get_slot_key(request)
        if key in self.fail_once:
            self.fail_once.discard(key)
            raise RuntimeError("transient failure")
        return super().time_until_ready(request)


def test_an_exception_while_choosing_keeps_the_slot() -> None:
    """A raise while a slot was off the heap left it neither ranked nor waiting."""
    queue, downloader, _ = make_queue(downloader_cls=FlakyDownloader)
    queue.push(req("a", 1))
    downloader.fail_once.add("a")
    with pytest.raises(RuntimeError):
        queue.pop_ready()
    assert len(queue) == 1
    assert queue.pop_ready() is not None


# ---------------------------------------------------------------- livelock


class Bucket:
    """A custom manager's token-bucket quota: refills continuously."""

    def __init__(self, downloader: Any) -> None:
        self.dl = downloader

    def quota_available(self, now: float) -> float:
        return min(100.0, 1.0 + 0.001 * now)  # 1 unit per 1000 s


class BucketScope:
    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.requests: set[Request] = set()


class RealTimeDownloader(FakeDownloader):
    """now() moves on each call, as a real clock does between two calls."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.calls = 0
        self.scopes = {"budget": BucketScope(Bucket(self))}
        self.registry = self

    def peek(self, scope_id: str) -> Any:
        return self.scopes.get(scope_id)

    def now(self) -> float:
        self.calls += 1
        if self.calls > 200_000:
            raise RuntimeError(f"livelock: now() called {self.calls} times in one pop")
        self.clock.advance(0.000_01)  # 10 us per call
        return self.clock.seconds()


def test_a_continuously_refilling_quota_does_not_spin_the_rank_check() -> None:
    """A rank that worsens with every look was filed again and again in one pop."""
    queue, downloader, _ = make_queue(downloader_cls=RealTimeDownloader)
    queue.push(req("a", 1, meta={"throttling_scopes": {"a": None, "budget": 1.0}}))
    downloader.calls = 0
    assert queue.pop_ready() is not None
    assert downloader.calls < 100


# ------------------------------------------------------------- quota groups


def quota_request(host: str, n: int, rng: random.Random) -> Request:
    """A request of *host* that may spend a shared quota or two, in various amounts."""
    scopes: dict[str, float | None] = {host: None}
    if rng.random() < 0.8:
        scopes["budget"] = rng.choice([None, 1.0, 2.0, 5.0])
    if rng.random() < 0.3:
        scopes["api"] = rng.choice([None, 3.0])
    return req(host, n, priority=rng.choice([0, 0, 1]), meta={"throttling_scopes": scopes})


@pytest.mark.parametrize("seed", range(8))
def test_quota_groups_choose_what_ranking_every_slot_would(seed: int) -> None:
    """Heads spending shared quotas, spent as requests reach the gate: each
    pop_ready takes the best ready slot by live quota shares, though only one
    entry per group of equal quota terms is refreshed per choice."""
    rng = random.Random(seed)
    crawler, downloader, engine, _, clock = slotkit_setup(
        {
            "THROTTLING_SCOPES": {
                "budget": {"quota": 400.0, "concurrency": 1000},
                "api": {"quota": 150.0, "concurrency": 1000},
            },
            "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
        }
    )
    queue = ThrottlingAwarePriorityQueue(crawler, FifoMemoryQueue, "", downloader=downloader)
    hosts = [f"h{i}.example" for i in range(10)]
    flying: list[Request] = []
    n = itertools.count()
    for _ in range(400):
        action = rng.random()
        if action < 0.45:
            queue.push(quota_request(rng.choice(hosts), next(n), rng))
        elif action < 0.6 and flying:
            engine.finish(flying.pop(rng.randrange(len(flying))))
        elif action < 0.65:
            clock.advance(rng.choice([0.5, 5.0]))
        else:
            ready = [
                (queue.rank(slot, queue._head(slot)), slot)
                for slot in queue.pqueues
                if downloader.time_until_ready(queue._head(slot)) <= 0
            ]
            expected = queue._head(min(ready)[1]) if ready else None
            request = queue.pop_ready()
            assert request is expected
            if request is not None:
                engine.fetch(request)
                engine.arrive(request)  # spends its quota amounts
                flying.append(request)


def test_a_quota_every_slot_spends_is_one_group_to_refresh() -> None:
    """A quota shared by 300 sites: a pop ranks a few slots, not all 300 (every
    one was ranked again at every choice before)."""
    crawler, downloader, engine, _, _ = slotkit_setup(
        {"THROTTLING_SCOPES": {"budget": {"quota": 1e6, "concurrency": 10**6}}}
    )
    queue = ThrottlingAwarePriorityQueue(crawler, FifoMemoryQueue, "", downloader=downloader)
    for site in range(300):
        for n in range(2):
            host = f"s{site}.example"
            queue.push(req(host, n, meta={"throttling_scopes": [host, "budget"]}))
    ranked: Counter[str] = Counter()
    rank = queue._rank_and_terms

    def counting_rank(slot: str, head: Request) -> Any:
        ranked[slot] += 1
        return rank(slot, head)

    queue._rank_and_terms = counting_rank  # type: ignore[method-assign]
    for _ in range(50):
        request = queue.pop_ready()
        engine.fetch(request)
        engine.arrive(request)  # the budget's share grows for every slot
        engine.finish(request)
    assert sum(ranked.values()) < 50 * 10


class FailingQuota:
    """A custom manager whose quota_available raises while ``failing``."""

    def __init__(self) -> None:
        self.failing = 0

    def quota_available(self, now: float) -> float:
        if self.failing:
            self.failing -= 1
            raise RuntimeError("quota service unreachable")
        return 10.0


class QuotaRegistryDownloader(FakeDownloader):
    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.quota = FailingQuota()
        self.registry = self

    def peek(self, scope_id: str) -> Any:
        return BucketScope(self.quota) if scope_id == "budget" else None


def test_a_slot_whose_rank_raises_is_kept_and_asked_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Ranking a slot raised after its request was pushed (or the one before it
    popped): the error is logged once, the request is neither lost nor pushed
    twice, and the slot is ranked again a second later."""
    queue, downloader, clock = make_queue(downloader_cls=QuotaRegistryDownloader)
    meta = {"throttling_scopes": {"a": None, "budget": 1.0}}
    downloader.quota.failing = 2
    queue.push(req("a", 0, meta=meta))  # ranking the new head raises
    assert queue.pop_ready() is None
    clock.advance(1.0)
    assert queue.pop_ready() is None  # still failing
    clock.advance(1.0)
    assert url_of(queue.pop_ready()) == "http://a/0"
    logged = [r for r in caplog.records if "could not read or rank slot 'a'" in r.getMessage()]
    assert len(logged) == 1  # once per run of failures

    # Ranking the next head after a pop raises: the popped request is still returned.
    queue.push(req("a", 1, meta=meta))
    queue.push(req("a", 2, meta=meta))
    rank_and_terms = queue._rank_and_terms

    def failing_for_the_next_head(slot: str, head: Request) -> Any:
        if head.url == "http://a/2":
            raise RuntimeError("quota service unreachable")
        return rank_and_terms(slot, head)

    queue._rank_and_terms = failing_for_the_next_head  # type: ignore[method-assign]
    assert url_of(queue.pop_ready()) == "http://a/1"
    queue._rank_and_terms = rank_and_terms  # type: ignore[method-assign]
    assert queue.pop_ready() is None
    clock.advance(1.0)
    assert url_of(queue.pop_ready()) == "http://a/2"
    assert len(queue) == 0


class NoPeekQueue(FifoMemoryQueue):
    """A downstream queue without peek() (queuelib before 1.6.2, or a custom one)."""

    def peek(self) -> Any:
        raise NotImplementedError


def test_a_downstream_queue_that_cannot_peek_is_named() -> None:
    clock = Clock()
    crawler = get_crawler(settings_dict={})
    downloader = FakeDownloader(clock)
    attach_engine(crawler, downloader)
    queue = ThrottlingAwarePriorityQueue(crawler, NoPeekQueue, "", downloader=downloader)
    with pytest.raises(TypeError, match=r"needs queues that can peek; .*NoPeekQueue cannot"):
        queue.push(req("a"))


# ------------------------------------------------------------- found by a review (files)


def job_queue(tmp_path: Path, state: Any = None, **kwargs: Any) -> ThrottlingAwarePriorityQueue:
    crawler = get_crawler()
    downloader = FakeDownloader(Clock())
    attach_engine(crawler, downloader)
    return ThrottlingAwarePriorityQueue(
        crawler, PickleFifoDiskQueue, str(tmp_path), state, downloader=downloader, **kwargs
    )


class Descriptors:
    """Free file descriptors, taken the way idle keep-alive sockets take them."""

    def __init__(self) -> None:
        self.taken: list[int] = []

    def take_all(self) -> None:
        with suppress(OSError):
            while True:
                self.taken.append(os.open(os.devnull, os.O_RDONLY))

    def give_back(self, count: int) -> None:
        for _ in range(count):
            os.close(self.taken.pop())


@contextmanager
def descriptors_free(count: int) -> Iterator[Descriptors]:
    """Leave this process exactly *count* descriptors to open.

    A limit set from the number of open files was off by the holes earlier
    tests left among descriptor numbers (the limit counts numbers): the same
    test passed here and failed on CI. So the limit goes a little above the
    highest number in use, and what is free below it is taken.
    """
    import gc
    import resource

    gc.collect()  # a dropped file closing inside the block would free one
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    limit = highest + 64 if hard == resource.RLIM_INFINITY else min(hard, highest + 64)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    descriptors = Descriptors()
    try:
        descriptors.take_all()
        descriptors.give_back(count)
        yield descriptors
    finally:
        descriptors.give_back(len(descriptors.taken))
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts open files in /proc")
@pytest.mark.parametrize("freed_kept", [False, True])
def test_a_sub_queue_that_cannot_reopen_keeps_its_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, freed_kept: bool
) -> None:
    """Reopening a closed sub-queue failed half way (no descriptor left): it
    forgot the priorities not reopened yet, and a push then dropped the slot.
    Now the other sub-queues close to make room; if that is not enough (sockets
    take what they free), the request goes to memory and the slot stays as it
    was on disk."""
    monkeypatch.setattr(pqueue_slot, "open_queue_limit", lambda: 2)
    queue = job_queue(tmp_path)
    for host in ("a", "b"):
        queue.push(req(host, 0, priority=0))
        queue.push(req(host, 1, priority=1))
    assert queue.pqueues["a"]._asleep is not None
    with descriptors_free(0) as descriptors:
        if freed_kept:
            close_all_but = pqueue_slot.OpenQueues.close_all_but

            def close_and_lose(self: pqueue_slot.OpenQueues, keep: Any) -> None:
                close_all_but(self, keep)
                descriptors.take_all()

            monkeypatch.setattr(pqueue_slot.OpenQueues, "close_all_but", close_and_lose)
            with pytest.raises(ValueError, match="could not take it"):
                queue.push(req("a", 2))  # the scheduler keeps this one in memory
        else:
            queue.push(req("a", 2))
            assert queue.pqueues["b"]._asleep is not None  # closed to make room
    resumed = job_queue(tmp_path, queue.close())
    urls = sorted(request.url for request in iter(resumed.pop, None))
    expected = ["http://a/0", "http://a/1", "http://b/0", "http://b/1"]
    assert urls == sorted(expected + ["http://a/2"] * (not freed_kept))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts open files in /proc")
def test_a_pop_out_of_descriptors_closes_the_other_sub_queues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sockets took the descriptors a closed sub-queue needs to reopen: the
    other sub-queues close, and the pop goes on; nothing is lost."""
    monkeypatch.setattr(pqueue_slot, "open_queue_limit", lambda: 4)
    queue = job_queue(tmp_path)
    for host in ("a", "b", "c"):
        queue.push(req(host, 0, priority=0))
        queue.push(req(host, 1, priority=1))
    assert queue.pqueues["a"]._asleep is not None
    with descriptors_free(0):
        first = queue.pop_ready()
    assert first is not None  # a sleeping sub-queue opened: the others made room
    rest = list(iter(queue.pop_ready, None))
    assert sorted(r.url for r in [first, *rest]) == [
        f"http://{host}/{n}" for host in ("a", "b", "c") for n in (0, 1)
    ]


def test_a_refused_push_leaves_no_empty_priority_queue(tmp_path: Path) -> None:
    """With start-request queues (Scrapy passes them with JOBDIR): a priority's
    queue emptied, an unserializable request then pushed at that priority left
    an empty queue where peek() stopped (KeyError), so the slot never went."""
    queue = job_queue(tmp_path, start_queue_cls=PickleFifoDiskQueue)
    start = {"is_start_request": True}
    queue.push(req("a", 1, priority=-1, meta=start))
    queue.push(req("a", 2))
    assert url_of(queue.pop_ready()) == "http://a/2"
    with pytest.raises(ValueError, match=r"pickle|local object"):  # 3.13's message
        queue.push(req("a", 3, meta={"bad": lambda: None}))
    queue.push(req("a", 4, priority=-1, meta=start))
    assert sorted(r.url for r in iter(queue.pop_ready, None)) == ["http://a/1", "http://a/4"]


def test_a_slot_whose_rank_raises_while_choosing_does_not_starve_the_others() -> None:
    """Filed back under its old rank, it came out first and raised at every pop."""
    queue, downloader, _ = make_queue(downloader_cls=QuotaRegistryDownloader)
    queue.push(req("a", 0, meta={"throttling_scopes": {"a": None, "budget": 1.0}}))
    queue.push(req("z", 0))  # ranks after a (no quota share)
    downloader.quota.failing = 10**6
    assert url_of(queue.pop_ready()) == "http://z/0"


def test_a_request_that_cannot_move_to_its_sites_sub_queue_stays_queued(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A Crawl-delay read later moves s.example.com's queued request out of its
    group's sub-queue; a push that fails there (a full disk) lost the request."""
    crawler, downloader, _, _, _ = slotkit_setup(
        {"THROTTLING_DOMAIN_GROUPING": "registrable_domain", "ROBOTSTXT_OBEY": True}
    )
    queue = ThrottlingAwarePriorityQueue(crawler, FifoMemoryQueue, "", downloader=downloader)
    queue.push(req("s.example.com", 1))
    queue.push(req("www.example.com", 1))
    assert sorted(queue.pqueues) == ["example.com"]
    downloader.crawl_delays.delays["s.example.com"] = 0.5
    push = queue.push

    def failing_push(request: Request) -> None:
        raise ValueError("the job directory could not take it")

    monkeypatch.setattr(queue, "push", failing_push)
    first = queue.pop_ready()
    monkeypatch.setattr(queue, "push", push)
    assert url_of(first) == "http://www.example.com/1"
    assert len(queue) == 1
    assert "could not move" in caplog.text
    assert url_of(queue.pop()) == "http://s.example.com/1"


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts open files in /proc")
def test_a_job_out_of_descriptors_neither_raises_nor_loses_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe: sockets held every descriptor. pop_ready() raised OSError into the
    engine's loop (logged by asyncio, the crawl slowed 8-10 times), and a push
    that went to memory left an empty slot directory. Now a slot that cannot be
    read waits a second while others may go; nothing is lost."""
    monkeypatch.setattr(pqueue_slot, "open_queue_limit", lambda: 4)
    queue = job_queue(tmp_path)
    clock = queue.downloader.clock
    for site in range(10):
        queue.push(req(f"s{site}", 0))
    queue.pqueues.open_queues.close_all_but(None)  # type: ignore[union-attr, arg-type]
    with descriptors_free(0):
        assert queue.pop_ready() is None
        with pytest.raises(ValueError, match="could not take it"):
            queue.push(req("new", 0))  # the scheduler keeps it in memory
    assert not [p for p in tmp_path.iterdir() if p.is_dir() and not any(p.iterdir())]
    clock.advance(1.0)
    urls = [request.url for request in iter(queue.pop_ready, None)]
    assert sorted(urls) == sorted(f"http://s{site}/0" for site in range(10))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts open files in /proc")
def test_a_push_for_a_new_site_out_of_descriptors_closes_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pqueue_slot, "open_queue_limit", lambda: 8)
    queue = job_queue(tmp_path)
    for site in range(6):
        queue.push(req(f"s{site}", 0))
    with descriptors_free(0):
        queue.push(req("new", 0))  # went to memory before
    urls = sorted(request.url for request in iter(queue.pop_ready, None))
    assert urls == sorted([*(f"http://s{site}/0" for site in range(6)), "http://new/0"])
