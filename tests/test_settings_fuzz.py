"""Settings fuzz: any value either works or is refused with a SettingsError naming its setting.

Random ``THROTTLING_*``, ``BACKOFF_*``, ``RAMPUP_*``, ``DOWNLOAD_SLOTS`` and
the stock settings slotkit reads (``DOWNLOAD_DELAY``, ``CONCURRENT_REQUESTS*``
...) are fed, mostly plausible with a few junk values mixed in (wrong types,
negatives, NaN/inf, nested junk, unknown keys, strings, huge ints), to:

1. :meth:`ThrottlingSettings.from_settings`, then a scope manager built for a
   few scope ids as the downloader builds them, and one
   ``can_send``/``record_sent``/``record_done`` round with a backoff step and
   a hold, at a reactor-like ``now`` (epoch seconds);
2. the :class:`slotkit.Downloader` constructor (``get_crawler``), then the
   same round through its registry.

Each example must succeed, or raise :class:`SettingsError` whose message
names one of the settings given; anything else (TypeError, KeyError, a bare
ValueError, ZeroDivisionError, OverflowError, a hang) is a bug. Import paths
come from a fixed list, never from random text, so no arbitrary module is
imported. ``AUTOTHROTTLE_*`` are Scrapy's own settings: only the switch is
fuzzed (it changes how ``DOWNLOAD_DELAY`` is read), with valid values.

Every bug found so far (eight, all fixed) is pinned as a regression test at
the end of this file. While a new one is open, it gets a strict xfail test
there and a :data:`KNOWN_BUGS` entry that recognises it (by exception type
and the slotkit line it escaped from, or :class:`NotANumber`), so the fuzz
rejects those examples and keeps looking for others; when the fix lands,
the pinned test XPASSes (strict: the suite fails) as a reminder to drop the
marker and the entry. Longer run::

    HYPOTHESIS_PROFILE=long /work/venv/bin/python -m pytest \\
        tests/test_settings_fuzz.py -q --timeout=0
"""

from __future__ import annotations

import contextlib
import math
import signal
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, event, given, note, reject, settings
from hypothesis import strategies as st
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler
from twisted.internet.task import Clock

from slotkit import Downloader
from slotkit.scope import ThrottlingScopeManager
from slotkit.scope_managers import check_scope_managers, create_scope_manager
from slotkit.settings import CUSTOM, DOMAIN, IP, SettingsError, ThrottlingSettings

#: A reactor's ``seconds()``: float steps here are ~2e-7 s, which tiny windows fall under.
NOW = 1_750_000_000.0
#: Scope ids looked up after the settings are read: configured or not, of every kind.
LOOKUPS = (("example.com", DOMAIN), ("1.2.3.4", IP), ("api", CUSTOM), ("slot-a", DOMAIN))
SCOPE_IDS = ("example.com", "api", "1.2.3.4", "slot-a")
#: An example that spends this much CPU time is a hang.
WATCHDOG_SECONDS = 5.0
IN_MEMORY = "slotkit.testing.InMemoryDownloadHandler"


class FuzzScopeManager(ThrottlingScopeManager):
    """A user scope manager class: built through ``from_crawler(crawler, config.as_dict())``."""


class DuckManager:
    """A user throttling manager that only defines ``get_scopes``."""

    def get_scopes(self, request: Any) -> str:
        return "api"


HERE = __name__
CLASS_PATHS = (
    "slotkit.ThrottlingScopeManager",
    "slotkit.scope.ThrottlingScopeManager",
    f"{HERE}.FuzzScopeManager",
    "slotkit.ThrottlingManager",
    f"{HERE}.DuckManager",
    "builtins.dict",
    "builtins.int",
    "os.path.join",
    "slotkit",
    "slotkit.NoSuchThing",
    "no_such_module_xyz.Thing",
    "nodots",
    "",
    ".x",
    "..x",
    "slotkit..Downloader",
    "slotkit.",
)
EXCEPTION_PATHS = (
    "scrapy.exceptions.DownloadTimeoutError",
    "twisted.internet.error.TimeoutError",
    "builtins.ConnectionError",
    "builtins.int",
    "no_such_module_xyz.Error",
    "..x",
    "nodots",
)

# ----------------------------------------------------------------- junk


def _text() -> st.SearchStrategy[str]:
    # No dots: a dotted string could name (and import) a real module.
    return st.text(st.characters(blacklist_characters=".", blacklist_categories=["Cs"]), max_size=6)


junk_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.sampled_from([10**400, -(10**400), 2**63, 2**1024]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e-300, 5e-324, 1e308, -0.0, 1e-12]),
    _text(),
    st.sampled_from(
        [
            "1",
            "0",
            "-1",
            "1.5",
            "nan",
            "inf",
            "-inf",
            "1e999",
            "",
            " 2 ",
            "0x10",
            "True",
            "false",
            "yes",
            "{}",
            "[]",
            '{"a": 1}',
            "[1, 2]",
            '{"a": {"delay": -1}}',
            "1_000",
            "٣",
        ]
    ),
    st.binary(max_size=4),
    st.complex_numbers(max_magnitude=10),
    st.sampled_from([object, dict, int, ThrottlingScopeManager, ValueError, print]),
)
junk = st.recursive(
    junk_leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.tuples(children, children),
        st.dictionaries(st.one_of(_text(), st.integers(-3, 3)), children, max_size=3),
        st.frozensets(st.one_of(st.integers(-3, 600), _text()), max_size=3),
    ),
    max_leaves=6,
)

# ----------------------------------------------------------------- plausible values

small_int = st.one_of(st.integers(0, 20), st.sampled_from([1.0, 2.0, "3", 10**30]))
positive_int = st.one_of(st.integers(1, 20), st.sampled_from([2.0, "4", 10**30]))
seconds = st.one_of(
    st.floats(0, 1000),
    st.sampled_from([0, 1, "1.5", 0.25, 1e-12, 1e-7, 86400 * 365, 1e300]),
)
positive_seconds = st.one_of(st.floats(1e-9, 1000), st.sampled_from([1, "2", 1e-12, 1e-7, 1e300]))
jitter = st.one_of(
    st.floats(0, 2),
    st.booleans(),
    st.tuples(st.floats(-1, 1), st.floats(-1, 3)),
    st.lists(st.floats(-1, 1), min_size=2, max_size=2),
)
factor = st.one_of(st.floats(1.0001, 100), st.sampled_from([2, "3", 1e300]))
codes = st.lists(st.integers(100, 599), max_size=4)
exceptions = st.lists(
    st.one_of(st.sampled_from(EXCEPTION_PATHS), st.sampled_from([TimeoutError, OSError])),
    max_size=3,
)
target = st.one_of(st.integers(0, 5), st.tuples(st.integers(0, 3), st.integers(0, 6)))
class_path = st.one_of(st.sampled_from(CLASS_PATHS), st.sampled_from([ThrottlingScopeManager]))


def maybe_junk(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly *strategy*, sometimes junk."""
    return st.one_of(strategy, strategy, strategy, junk)


backoff_entry = st.fixed_dictionaries(
    {},
    optional={
        "http_codes": maybe_junk(codes),
        "exceptions": maybe_junk(exceptions),
        "delay_factor": maybe_junk(factor),
        "max_delay": maybe_junk(seconds),
        "min_delay": maybe_junk(seconds),
        "jitter": maybe_junk(jitter),
        "window": maybe_junk(seconds),  # not a key of a scope's backoff: refused
        "delay_factr": junk,
    },
)
rampup_entry = st.one_of(
    st.booleans(),
    st.fixed_dictionaries(
        {},
        optional={
            "backoff_target": maybe_junk(target),
            "delay_factor": maybe_junk(st.floats(0.01, 0.99)),
            "min_delay": maybe_junk(seconds),
            "window": junk,
        },
    ),
)
scope_entry = st.fixed_dictionaries(
    {},
    optional={
        "concurrency": maybe_junk(positive_int),
        "min_concurrency": maybe_junk(positive_int),
        "delay": maybe_junk(seconds),
        "jitter": maybe_junk(jitter),
        "manager": maybe_junk(class_path),
        "backoff": maybe_junk(backoff_entry),
        "quota": maybe_junk(st.one_of(st.floats(1e-6, 1e6), st.integers(1, 100))),
        "window": maybe_junk(positive_seconds),
        "rampup": maybe_junk(rampup_entry),
        "ignore_robots_txt": maybe_junk(st.booleans()),
        "concurency": junk,
    },
)
slot_entry = st.fixed_dictionaries(
    {},
    optional={
        "concurrency": maybe_junk(positive_int),
        "delay": maybe_junk(seconds),
        "jitter": maybe_junk(jitter),
        "randomize_delay": maybe_junk(st.booleans()),
        "throttle": junk,  # unknown DOWNLOAD_SLOTS keys are warned about, as Scrapy ignores them
    },
)
scope_ids = st.one_of(st.sampled_from(SCOPE_IDS), junk_leaf)

PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "THROTTLING_SCOPES": st.one_of(
        st.dictionaries(scope_ids, maybe_junk(scope_entry), max_size=3),
        st.sampled_from(['{"api": {"delay": 2}}', '{"api": {"delay": "x"}}', "[1, 2]", "{"]),
    ),
    "DOWNLOAD_SLOTS": st.dictionaries(
        st.sampled_from(SCOPE_IDS), maybe_junk(slot_entry), max_size=3
    ),
    "BACKOFF_HTTP_CODES": codes,
    "BACKOFF_EXCEPTIONS": exceptions,
    "BACKOFF_DELAY_FACTOR": factor,
    "BACKOFF_MAX_DELAY": seconds,
    "BACKOFF_MIN_DELAY": seconds,
    "BACKOFF_JITTER": jitter,
    "BACKOFF_WINDOW": seconds,
    "BACKOFF_RESEND": st.booleans(),
    "BACKOFF_RESEND_TIMEOUT": seconds,
    "RAMPUP_BACKOFF_TARGET": target,
    "THROTTLING_WINDOW": positive_seconds,
    "THROTTLING_SCOPE_CONCURRENCY": positive_int,
    "THROTTLING_SCOPE_LIMIT": small_int,
    "THROTTLING_SCOPE_MAX_IDLE": seconds,
    "THROTTLING_DEBUG": st.booleans(),
    "THROTTLING_MANAGER": class_path,
    "THROTTLING_SCOPE_MANAGER": class_path,
    "THROTTLING_DOMAIN_GROUPING": st.sampled_from(["host", "registrable_domain", "hosts"]),
    "THROTTLING_ROBOTSTXT_OBEY": st.booleans(),
    "THROTTLING_ROBOTSTXT_MAX_DELAY": seconds,
    "THROTTLING_STATS_INTERVAL": seconds,
    "DOWNLOAD_DELAY": seconds,
    "DOWNLOAD_DELAY_JITTER": jitter,
    "RANDOMIZE_DOWNLOAD_DELAY": st.booleans(),
    "CONCURRENT_REQUESTS": small_int,
    "CONCURRENT_REQUESTS_PER_DOMAIN": positive_int,
    "CONCURRENT_REQUESTS_PER_IP": small_int,
    "DELAYED_REQUESTS_WARN_THRESHOLD": small_int,
}
#: Scrapy's own switches that change how slotkit reads the settings above (valid values only).
SWITCHES: dict[str, st.SearchStrategy[Any]] = {
    "AUTOTHROTTLE_ENABLED": st.booleans(),
    "ROBOTSTXT_OBEY": st.booleans(),
}
FUZZED = tuple(PLAUSIBLE)


@st.composite
def settings_dicts(draw: Any) -> dict[str, Any]:
    """A few plausible settings, and zero to two of them (or of the rest) replaced by junk."""
    names = draw(st.lists(st.sampled_from(FUZZED), max_size=6, unique=True))
    values = {name: draw(PLAUSIBLE[name]) for name in names}
    for name in draw(st.lists(st.sampled_from(FUZZED), max_size=2, unique=True)):
        values[name] = draw(junk)
    for name, strategy in SWITCHES.items():
        if draw(st.booleans()):
            values[name] = draw(strategy)
    return values


# ----------------------------------------------------------------- helpers


class Hang(AssertionError):
    """The code under test ran for longer than WATCHDOG_SECONDS."""


@contextlib.contextmanager
def watchdog(seconds: float = WATCHDOG_SECONDS) -> Iterator[None]:
    """Turn a hang into a test failure.

    On CPU time (SIGPROF): an endless loop spends it, a busy machine does not;
    a wall-clock alarm went off under load, in the middle of Hypothesis's own
    code. pytest-timeout's wall-clock alarm (SIGALRM) is left alone.
    """
    if not hasattr(signal, "setitimer"):
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        raise Hang(f"{seconds}s of CPU without an answer: an endless loop")

    previous_handler = signal.signal(signal.SIGPROF, expired)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous_handler)


def scrapy_settings(values: dict[str, Any]) -> Settings:
    """Scrapy's Settings of *values*; Scrapy itself refuses some (DOWNLOAD_SLOTS = 5): skipped."""
    try:
        return Settings(values)
    except Exception:
        assume(False)
        raise  # unreachable


class NotANumber(AssertionError):
    """A scope manager answered NaN (``wait > 0`` is False for it: the gate would not wait)."""


#: Bugs already reported, each pinned below: name -> test on (exception, last slotkit
#: frame, None when it was raised outside slotkit). A new one goes here until its fix lands.
KNOWN_BUGS: dict[str, Callable[[BaseException, traceback.FrameSummary | None], bool]] = {
    # Empty: every bug the fuzz found is fixed and pinned by a test at the end of this file.
    # Example entry: "NaN wait": lambda exc, frame: isinstance(exc, NotANumber),
}


def known_bug(error: BaseException) -> str | None:
    """The KNOWN_BUGS entry *error* is an instance of, if any."""
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if "/slotkit/" in frame.filename.replace("\\", "/")
    ]
    last = frames[-1] if frames else None
    return next((name for name, test in KNOWN_BUGS.items() if test(error, last)), None)


@contextlib.contextmanager
def skipping_known_bugs() -> Iterator[None]:
    """Reject an example that only hits a bug already reported; let anything else through."""
    try:
        yield
    except Exception as error:
        name = known_bug(error)
        if name is None:
            raise
        event(f"known bug: {name}")
        reject()


def check_refusal(error: SettingsError, values: dict[str, Any]) -> None:
    """A refusal must name one of the settings that were given."""
    message = str(error)
    named = [name for name in values if name in message]
    assert named, f"SettingsError names none of {sorted(values)}: {message}"


def check_wait(wait: float) -> None:
    """A wait is a number >= 0 (math.inf included), never NaN."""
    if math.isnan(wait):
        raise NotANumber("can_send() answered NaN")
    assert wait >= 0, wait


def exercise(manager: Any, now: float = NOW) -> None:
    """One request's worth of calls, a backoff step and a hold; answers must be sane."""
    check_wait(manager.can_send(now, None))
    manager.record_sent(now, None)
    check_wait(manager.can_send(now + 0.25, None))
    manager.record_done(now + 0.5)
    manager.record_backoff(None, now + 0.5)
    manager.record_backoff(2.0, now + 0.5)
    for later in (now + 0.5, now + 1.0, now + 3600.0, now + 86400.0 * 30):
        check_wait(manager.can_send(later, 1.0))
    manager.is_idle(now + 86400.0 * 30, 3600.0)


# ----------------------------------------------------------------- the fuzz tests

FUZZ_SETTINGS = settings(
    deadline=None,  # building a crawler takes ~25 ms, more when the machine is busy
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@FUZZ_SETTINGS
@given(values=settings_dicts())
def test_settings_either_work_or_name_the_setting(values: dict[str, Any]) -> None:
    """from_settings, then scope managers for a few ids: success, or a SettingsError naming one."""
    crawler_settings = scrapy_settings(values)
    note(f"settings: {values!r}")
    with skipping_known_bugs(), watchdog():
        try:
            config = ThrottlingSettings.from_settings(crawler_settings)
            check_scope_managers(config)  # as Downloader.__init__ does
            for scope_id, kind in (*LOOKUPS, *((s, CUSTOM) for s in config.scopes)):
                manager = create_scope_manager(None, config.scope_config(scope_id, kind))  # type: ignore[arg-type]
                exercise(manager)
            event("accepted")
        except SettingsError as error:
            event("refused")
            check_refusal(error, values)


@settings(FUZZ_SETTINGS, max_examples=max(20, settings.default.max_examples // 5))
@given(values=settings_dicts())
def test_downloader_constructor_raises_only_settings_errors(values: dict[str, Any]) -> None:
    """slotkit.Downloader(crawler) with fuzzed settings: built, or refused with a SettingsError."""
    values = {
        **values,
        "DOWNLOAD_HANDLERS": {"http": IN_MEMORY, "https": IN_MEMORY},
        "DOWNLOADER": "slotkit.Downloader",
    }
    try:
        crawler = get_crawler(settings_dict=values)
    except Exception:
        assume(False)  # Scrapy itself refused the settings
    note(f"settings: {values!r}")
    with skipping_known_bugs(), watchdog():
        try:
            downloader = Downloader(crawler, clock=Clock())
        except SettingsError as error:
            event("refused")
            check_refusal(error, values)
            return
        event("accepted")
        clock = downloader._clock
        clock.advance(NOW)  # type: ignore[attr-defined]
        for scope_id, _ in LOOKUPS:
            exercise(downloader.registry.get(scope_id).manager, clock.seconds())
        downloader.close()
        assert clock.getDelayedCalls() == []  # type: ignore[attr-defined]


# ----------------------------------------------------------------- bugs found, pinned


def outcome(values: dict[str, Any], *, round_trip: bool = False) -> str:
    """``"ok"``, ``"SettingsError: ..."`` or the name of the wrong exception raised."""
    try:
        with watchdog(2.0):
            config = ThrottlingSettings.from_settings(Settings(values))
            if round_trip:
                for scope_id, kind in LOOKUPS:
                    exercise(create_scope_manager(None, config.scope_config(scope_id, kind)))  # type: ignore[arg-type]
    except SettingsError as error:
        return f"SettingsError: {error}"
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return "ok"


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({"DOWNLOAD_DELAY": 10**400}, id="DOWNLOAD_DELAY"),
        pytest.param({"THROTTLING_SCOPES": {"api": {"quota": 10**400}}}, id="scope-quota"),
        pytest.param({"BACKOFF_JITTER": [-(10**400), 0]}, id="BACKOFF_JITTER"),
    ],
)
def test_huge_int_is_refused_with_a_settings_error(values: dict[str, Any]) -> None:
    """An int too large for a float is refused like any other out-of-range number."""
    assert outcome(values).startswith("SettingsError")


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({"THROTTLING_MANAGER": "..x"}, id="THROTTLING_MANAGER"),
        pytest.param({"BACKOFF_EXCEPTIONS": ["..x"]}, id="BACKOFF_EXCEPTIONS"),
    ],
)
def test_unimportable_path_is_refused_with_a_settings_error(values: dict[str, Any]) -> None:
    """A path importlib refuses with TypeError ('..x': relative import) is a SettingsError."""
    assert outcome(values).startswith("SettingsError")


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({"THROTTLING_DEBUG": "maybe"}, id="THROTTLING_DEBUG-str"),
        pytest.param({"THROTTLING_DEBUG": [1]}, id="THROTTLING_DEBUG-list"),
        pytest.param({"BACKOFF_RESEND": "nope"}, id="BACKOFF_RESEND"),
        pytest.param(
            {"ROBOTSTXT_OBEY": True, "THROTTLING_ROBOTSTXT_OBEY": "x"},
            id="THROTTLING_ROBOTSTXT_OBEY",
        ),
    ],
)
def test_bad_boolean_is_refused_with_a_settings_error(values: dict[str, Any]) -> None:
    """A boolean setting that is not a boolean is a SettingsError naming it."""
    result = outcome(values)
    assert result.startswith("SettingsError")
    assert next(name for name in values if name != "ROBOTSTXT_OBEY") in result


def test_json_text_that_is_not_an_object_is_refused() -> None:
    """THROTTLING_SCOPES = '[1, 2]' (JSON, but not an object) is a SettingsError."""
    assert outcome({"THROTTLING_SCOPES": "[1, 2]"}).startswith("SettingsError")


def test_unhashable_domain_grouping_is_refused() -> None:
    """THROTTLING_DOMAIN_GROUPING = ['host'] is a SettingsError, not a TypeError."""
    assert outcome({"THROTTLING_DOMAIN_GROUPING": ["host"]}).startswith("SettingsError")


def test_bad_download_delay_with_autothrottle_is_refused() -> None:
    """DOWNLOAD_DELAY = 'x' with AUTOTHROTTLE_ENABLED is a SettingsError naming DOWNLOAD_DELAY."""
    result = outcome({"AUTOTHROTTLE_ENABLED": True, "DOWNLOAD_DELAY": "x"})
    assert result.startswith("SettingsError")
    assert "DOWNLOAD_DELAY" in result


def test_tiny_backoff_window_with_rampup_does_not_hang() -> None:
    """BACKOFF_WINDOW = 1e-9 with a rampup scope: refused, or answered (no endless loop)."""
    result = outcome(
        {"BACKOFF_WINDOW": 1e-9, "THROTTLING_SCOPES": {"api": {"rampup": True}}}, round_trip=True
    )
    assert result == "ok" or result.startswith("SettingsError"), result


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({"BACKOFF_JITTER": 8.98846567431158e307}, id="BACKOFF_JITTER"),
        pytest.param({"DOWNLOAD_DELAY_JITTER": 1e308}, id="DOWNLOAD_DELAY_JITTER"),
        pytest.param({"THROTTLING_SCOPES": {"example.com": {"jitter": 1e308}}}, id="scope-jitter"),
    ],
)
def test_huge_jitter_is_refused_or_harmless(values: dict[str, Any]) -> None:
    """A jitter bound near float max is refused, or at least never makes can_send() NaN.

    1 + uniform(-x, x) overflowed to inf, and a zero delay times inf is NaN,
    which the gate read as "go now".
    """
    result = outcome(values, round_trip=True)
    assert result == "ok" or result.startswith("SettingsError"), result
