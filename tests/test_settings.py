"""Tests for slotkit.settings: reading, validating and resolving the throttling settings."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler
from twisted.internet.task import Clock

from slotkit.downloader import Downloader
from slotkit.scope_entries import forget_setting_warnings
from slotkit.settings import (
    CUSTOM,
    DOMAIN,
    IP,
    NO_JITTER,
    RESERVED_SCOPE_KEYS,
    SCOPE_KEYS,
    ScopeConfig,
    SettingsError,
    ThrottlingSettings,
    parse_jitter,
)

ONE_DELAY = 1.0
THREE_DELAY = 3.0

#: Scrapy 2.19 deprecates this setting; slotkit still reads it (IP scopes).
PER_IP_DEPRECATED = pytest.mark.filterwarnings(
    "ignore:The CONCURRENT_REQUESTS_PER_IP setting is deprecated"
)


def read(values: dict[str, Any] | None = None, **kwargs: Any) -> ThrottlingSettings:
    settings = Settings(values or {})
    for name, value in kwargs.items():
        settings.set(name, value)
    return ThrottlingSettings.from_settings(settings)


def refuse(values: dict[str, Any]) -> str:
    """The message of the SettingsError raised by reading *values*."""
    with pytest.raises(SettingsError) as info:
        read(values)
    return str(info.value)


# ----------------------------------------------------------------- defaults


def test_defaults_follow_scrapy():
    """Without project settings the values are Scrapy 2.19's defaults."""
    config = read()
    assert config.domain_concurrency == 8
    assert config.ip_concurrency == 0
    assert config.scope_concurrency == 1
    assert config.total_concurrency == 16
    assert config.delay == 0.0
    assert config.jitter == (-0.5, 0.5)
    assert set(config.scopes) == {"quotes.toscrape.com"}  # the spec's default, below
    assert config.slots == {}
    assert config.scope_limit == 100_000
    assert config.scope_max_idle == 3600.0
    assert config.warn_threshold == 500
    assert config.debug is False
    assert config.manager is None
    assert config.scope_manager is None


def test_default_scopes_let_the_tutorial_site_go_fast():
    """Unset, THROTTLING_SCOPES lets quotes.toscrape.com (the tutorial's sandbox) go fast."""
    config = read()
    quotes = config.scope_config("quotes.toscrape.com", DOMAIN)
    assert (quotes.concurrency, quotes.delay) == (16, 0.0)
    assert quotes.sources["concurrency"] == "THROTTLING_SCOPES"
    other = read(DOWNLOAD_DELAY=2.0).scope_config("example.com", DOMAIN)
    assert (other.concurrency, other.delay) == (8, 2.0)


@pytest.mark.parametrize("value", [{}, {"example.com": {"concurrency": 2}}, "{}"])
def test_setting_throttling_scopes_replaces_the_default(value):
    """Like any Scrapy dict setting, a project's THROTTLING_SCOPES replaces the default."""
    config = read(THROTTLING_SCOPES=value, DOWNLOAD_DELAY=2.0)
    assert "quotes.toscrape.com" not in config.scopes
    quotes = config.scope_config("quotes.toscrape.com", DOMAIN)
    assert (quotes.concurrency, quotes.delay) == (8, 2.0)


def test_settings_error_is_a_value_error():
    """SettingsError subclasses ValueError, so generic handlers still catch it."""
    assert issubclass(SettingsError, ValueError)


# ----------------------------------------------------------------- THROTTLING_SCOPES rejections


def test_scope_entry_must_be_a_dict():
    """THROTTLING_SCOPES = {'a': 1} is refused, naming the scope, the value and the shape."""
    message = refuse({"THROTTLING_SCOPES": {"a": 1}})
    assert "THROTTLING_SCOPES['a']" in message
    assert "must be a dict" in message
    assert "1, a int" in message
    assert "'concurrency'" in message


@pytest.mark.parametrize("value", [["a", "b"], [], (), 0, False, ""])
def test_throttling_scopes_must_be_a_dict(value: Any):
    """A THROTTLING_SCOPES that is not a mapping is refused, even an empty one.

    Taken as {}, it would also drop the default entries, without a word.
    """
    message = refuse({"THROTTLING_SCOPES": value})
    assert message.startswith("THROTTLING_SCOPES must be a dict")
    assert repr(value) in message


@pytest.mark.parametrize("value", [[], None])
def test_download_slots_takes_what_scrapy_takes_for_none(value: Any):
    """Scrapy's getdict() reads an empty list as {}; a config that works there works here."""
    assert read({"DOWNLOAD_SLOTS": value}).slots == {}


def test_scope_id_must_be_a_non_empty_string():
    """Scope ids are non-empty strings."""
    assert "non-empty scope ids" in refuse({"THROTTLING_SCOPES": {"": {"delay": 1}}})
    assert "non-empty scope ids" in refuse({"THROTTLING_SCOPES": {3: {"delay": 1}}})


def test_negative_delay_is_refused():
    """A negative delay names the setting, the scope, the value and the rule."""
    message = refuse({"THROTTLING_SCOPES": {"api": {"delay": -1}}})
    assert message == "THROTTLING_SCOPES['api']['delay'] must be a number >= 0 (got -1, a int)"


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("5s", id="unit-suffix"),
        pytest.param(float("nan"), id="nan"),
        pytest.param(float("inf"), id="inf"),
        pytest.param(True, id="bool"),
        pytest.param(None, id="none"),
        pytest.param([1], id="list"),
    ],
)
def test_delay_must_be_a_finite_number(value: Any):
    """A delay that is not a finite number is refused, quoting what arrived."""
    message = refuse({"THROTTLING_SCOPES": {"api": {"delay": value}}})
    assert message.startswith("THROTTLING_SCOPES['api']['delay'] must be a number >= 0")
    assert repr(value) in message


def test_numeric_strings_are_accepted():
    """Values from the command line arrive as strings and are converted."""
    config = read({"THROTTLING_SCOPES": {"api": {"delay": "1.5", "concurrency": "3"}}})
    assert config.scopes["api"] == {"delay": 1.5, "concurrency": 3}


@pytest.mark.parametrize("value", [0, -2, 1.5, "two", True])
def test_concurrency_must_be_a_positive_integer(value: Any):
    """Concurrency 0 (or any non-integer) is refused, naming the scope and the rule."""
    message = refuse({"THROTTLING_SCOPES": {"a.example": {"concurrency": value}}})
    assert message.startswith(
        "THROTTLING_SCOPES['a.example']['concurrency'] must be an integer >= 1"
    )
    assert repr(value) in message


def test_integral_float_concurrency_is_accepted():
    """A float with an integral value, such as 2.0, is taken as the integer."""
    assert read({"THROTTLING_SCOPES": {"a": {"concurrency": 2.0}}}).scopes["a"]["concurrency"] == 2


def test_typo_suggests_the_right_key():
    """{'a': {'concurency': 2}} is refused with a suggestion of 'concurrency'."""
    message = refuse({"THROTTLING_SCOPES": {"a": {"concurency": 2}}})
    assert "THROTTLING_SCOPES['a']" in message
    assert "'concurency'" in message
    assert "did you mean 'concurrency'?" in message
    assert "accepted keys:" in message
    for key in ("concurrency", "delay", "jitter", "manager", "min_concurrency"):
        assert key in message


@pytest.mark.parametrize(
    ("entry", "meant"),
    [
        # The ceiling, not a typo of the floor "min_concurrency".
        ({"max_concurrency": 4}, "concurrency"),
        ({"CONCURRENCY": 4}, "concurrency"),
        # DOWNLOAD_SLOTS' names, copied into THROTTLING_SCOPES.
        ({"randomize_delay": True}, "jitter"),
        ({"download_delay": 1}, "delay"),
        ({"rampup": {"facter": 2}}, "delay_factor"),
    ],
)
def test_keys_written_for_another_are_pointed_to_it(entry: dict[str, Any], meant: str):
    """Found by an acceptance probe: these got no suggestion, or the wrong one."""
    message = refuse({"THROTTLING_SCOPES": {"a": entry}})
    assert f"did you mean {meant!r}?" in message


def test_unknown_key_without_close_match_lists_accepted_keys():
    """An unknown key that resembles nothing still lists every accepted key, without a guess."""
    message = refuse({"THROTTLING_SCOPES": {"a": {"xyzzy": 2}}})
    assert "did you mean" not in message
    assert "'xyzzy'" in message
    assert ", ".join(sorted(SCOPE_KEYS)) in message


@pytest.mark.parametrize(
    ("key", "homes"),
    [
        ("max_delay", "'backoff' dict"),
        ("http_codes", "'backoff' dict"),
        ("delay_factor", "'backoff' or 'rampup' dict"),
        ("backoff_target", "'rampup' dict"),
    ],
)
def test_a_backoff_or_rampup_option_at_the_top_says_where_it_goes(key: str, homes: str):
    """{'max_delay': 30} at an entry's top level was told "did you mean 'delay'?"."""
    message = refuse({"THROTTLING_SCOPES": {"a": {key: 3}}})
    assert f"THROTTLING_SCOPES['a'] has an unknown key {key!r}" in message
    assert f"an option of the scope's {homes}" in message
    assert "did you mean" not in message


@pytest.mark.parametrize(
    ("key", "site"),
    [
        ("A.test", "a.test"),
        ("http://a.test:8080/x", "a.test:8080"),
        ("LOCALHOST", "localhost"),
        # Scrapy sends the ASCII form of an internationalized host name.
        ("bücher.test", "xn--bcher-kva.test"),
        # A URL's IPv6 host comes without brackets, in lower case.
        ("[::1]", "::1"),
        ("FE80::1", "fe80::1"),
    ],
)
def test_a_key_no_site_can_match_is_warned_about(
    key: str, site: str, caplog: pytest.LogCaptureFixture
):
    """Keys meant for a site that no site's scope id can equal are named at start."""
    with caplog.at_level(logging.WARNING, logger="slotkit"):
        read({"THROTTLING_SCOPES": {key: {"concurrency": 1}}})
    assert f"key {key!r} is no site's scope id" in caplog.text
    assert f"{site!r}); as written it only serves requests that name it" in caplog.text


# host:port keys match whatever their case; "host/" is the spec's endpoint recipe's id.
@pytest.mark.parametrize(
    "key",
    [
        "a.test",
        "a.test:8080",
        "A.test:8080",
        "API",
        "api.example.com/search",
        "a.test/",
        "::1",
        "[::1]:8080",
        "[FE80::1]:8080",
    ],
)
def test_site_ids_and_custom_names_are_not_warned_about(key: str, caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.WARNING, logger="slotkit"):
        read({"THROTTLING_SCOPES": {key: {"concurrency": 1}}})
    assert "no site's scope id" not in caplog.text


def test_reserved_keys_are_refused_not_ignored(monkeypatch):
    """A key reserved for a feature not built yet is refused, naming scope, key and value."""
    monkeypatch.setattr("slotkit.scope_entries.RESERVED_SCOPE_KEYS", frozenset({"future"}))
    message = refuse({"THROTTLING_SCOPES": {"api": {"future": 3}}})
    assert "THROTTLING_SCOPES['api']['future']" in message
    assert "not supported" in message
    assert "3, a int" in message
    assert "accepted keys:" in message


def test_every_spec_key_is_accepted_or_reserved():
    """Each ThrottlingScopeConfig key of the spec is implemented or explicitly refused."""
    spec_keys = {
        "concurrency",
        "min_concurrency",
        "delay",
        "jitter",
        "quota",
        "window",
        "rampup",
        "backoff",
        "manager",
        "ignore_robots_txt",
    }
    assert spec_keys <= SCOPE_KEYS | RESERVED_SCOPE_KEYS
    assert not SCOPE_KEYS & RESERVED_SCOPE_KEYS


def test_ignore_robots_txt_must_be_a_bool():
    """ignore_robots_txt takes True or False only."""
    assert read({"THROTTLING_SCOPES": {"api": {"ignore_robots_txt": True}}})
    message = refuse({"THROTTLING_SCOPES": {"api": {"ignore_robots_txt": "yes"}}})
    assert "THROTTLING_SCOPES['api']['ignore_robots_txt']" in message
    assert "'yes'" in message


def test_min_concurrency_must_not_exceed_concurrency():
    """min_concurrency above the scope's concurrency is refused with both numbers."""
    message = refuse({"THROTTLING_SCOPES": {"a": {"concurrency": 2, "min_concurrency": 3}}})
    assert "THROTTLING_SCOPES['a']['min_concurrency'] (3)" in message
    assert "(2)" in message


def test_min_concurrency_must_be_positive():
    """min_concurrency 0 is refused."""
    message = refuse({"THROTTLING_SCOPES": {"a": {"min_concurrency": 0}}})
    assert message.startswith("THROTTLING_SCOPES['a']['min_concurrency'] must be an integer >= 1")


def test_manager_must_import():
    """A scope 'manager' that cannot be imported is refused, naming the path."""
    message = refuse({"THROTTLING_SCOPES": {"a": {"manager": "no.such.module.Manager"}}})
    assert "THROTTLING_SCOPES['a']['manager']" in message
    assert "'no.such.module.Manager'" in message


def test_manager_must_be_a_class():
    """A scope 'manager' that names a function or a number is refused."""
    assert "must name a class" in refuse(
        {"THROTTLING_SCOPES": {"a": {"manager": "slotkit.settings.parse_jitter"}}}
    )
    assert "class or an import path" in refuse({"THROTTLING_SCOPES": {"a": {"manager": 3}}})


def test_throttling_manager_must_import():
    """THROTTLING_MANAGER naming nothing importable is refused at read time."""
    message = refuse({"THROTTLING_MANAGER": "no.such.Manager"})
    assert message.startswith("THROTTLING_MANAGER could not be imported from 'no.such.Manager'")


def test_throttling_scope_manager_must_be_a_class():
    """THROTTLING_SCOPE_MANAGER naming a non-class is refused."""
    message = refuse({"THROTTLING_SCOPE_MANAGER": "slotkit.settings.parse_jitter"})
    assert message.startswith("THROTTLING_SCOPE_MANAGER must name a class")


def test_manager_classes_are_loaded():
    """Import paths of managers are resolved to the classes."""
    config = read(
        {
            "THROTTLING_MANAGER": "slotkit.manager.ThrottlingManager",
            "THROTTLING_SCOPE_MANAGER": "slotkit.scope.ThrottlingScopeManager",
            "THROTTLING_SCOPES": {"a": {"manager": "slotkit.scope.ThrottlingScopeManager"}},
        }
    )
    from slotkit.manager import ThrottlingManager
    from slotkit.scope import ThrottlingScopeManager

    assert config.manager is ThrottlingManager
    assert config.scope_manager is ThrottlingScopeManager
    assert config.scopes["a"]["manager"] is ThrottlingScopeManager


@pytest.mark.parametrize(
    ("values", "start"),
    [
        (
            {"CONCURRENT_REQUESTS_PER_DOMAIN": 0},
            "CONCURRENT_REQUESTS_PER_DOMAIN must be an integer >= 1",
        ),
        pytest.param(
            {"CONCURRENT_REQUESTS_PER_IP": -1},
            "CONCURRENT_REQUESTS_PER_IP must be an integer >= 0",
            marks=PER_IP_DEPRECATED,
        ),
        (
            {"THROTTLING_SCOPE_CONCURRENCY": 0},
            "THROTTLING_SCOPE_CONCURRENCY must be an integer >= 1",
        ),
        ({"CONCURRENT_REQUESTS": -1}, "CONCURRENT_REQUESTS must be an integer >= 0"),
        ({"DOWNLOAD_DELAY": -0.5}, "DOWNLOAD_DELAY must be a number >= 0"),
        ({"DOWNLOAD_DELAY_JITTER": -0.1}, "DOWNLOAD_DELAY_JITTER must be a number >= 0"),
        ({"THROTTLING_SCOPE_LIMIT": -1}, "THROTTLING_SCOPE_LIMIT must be an integer >= 0"),
        ({"THROTTLING_SCOPE_MAX_IDLE": -1}, "THROTTLING_SCOPE_MAX_IDLE must be a number >= 0"),
        ({"DELAYED_REQUESTS_WARN_THRESHOLD": "many"}, "DELAYED_REQUESTS_WARN_THRESHOLD must be"),
        ({"REDIRECT_MAX_DELAY": -1}, "REDIRECT_MAX_DELAY must be a number >= 0"),
    ],
)
def test_global_settings_are_validated(values: dict[str, Any], start: str):
    """Every numeric global setting is checked, and the message starts with its name."""
    assert refuse(values).startswith(start)


# ----------------------------------------------------------------- jitter


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.5, (-0.5, 0.5)),
        (0, NO_JITTER),
        ("0.25", (-0.25, 0.25)),
        ([-0.1, 0.3], (-0.1, 0.3)),
        ((0.0, 0.5), (0.0, 0.5)),
        (True, (-0.5, 0.5)),
        (False, NO_JITTER),
    ],
)
def test_parse_jitter_forms(value: Any, expected: tuple[float, float]):
    """A jitter is a magnitude, a [low, high] pair, or a RANDOMIZE_DOWNLOAD_DELAY-style bool."""
    assert parse_jitter("X", value) == expected


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ([0.1], "[low, high] pair"),
        ([0.1, 0.2, 0.3], "[low, high] pair"),
        ([0.3, 0.1], "low <= high"),
        ([-101, 0.1], "X[0] must be a number >= -100"),
        (
            -0.5,
            "X must be a number >= 0 (the share of the delay it may vary by, either way), "
            "a [low, high] pair",
        ),
        ("wide", "X must be a number >= 0"),
        ("wide", "a [low, high] pair, or True/False (got 'wide', a str)"),
    ],
)
def test_parse_jitter_rejections(value: Any, fragment: str):
    """Bad jitter values are refused, naming where they came from."""
    with pytest.raises(SettingsError, match=r".*") as info:
        parse_jitter("X", value)
    assert fragment in str(info.value)


def test_scope_jitter_overrides_the_default():
    """A scope's own jitter replaces the crawl-wide one."""
    config = read({"THROTTLING_SCOPES": {"a.example": {"jitter": [0.0, 0.2]}}})
    assert config.scope_config("a.example", DOMAIN).jitter == (0.0, 0.2)
    assert config.scope_config("b.example", DOMAIN).jitter == (-0.5, 0.5)


def test_download_delay_jitter_sets_the_default():
    """DOWNLOAD_DELAY_JITTER is the default jitter of every scope."""
    assert read({"DOWNLOAD_DELAY_JITTER": 0.2}).jitter == (-0.2, 0.2)
    assert read({"DOWNLOAD_DELAY_JITTER": [-0.1, 0.3]}).jitter == (-0.1, 0.3)


def test_randomize_download_delay_false_wins_over_default_jitter():
    """RANDOMIZE_DOWNLOAD_DELAY = False set by the project disables the default jitter."""
    assert read({"RANDOMIZE_DOWNLOAD_DELAY": False}).jitter == NO_JITTER


@pytest.mark.parametrize(
    ("value", "jitter"),
    [
        (0.2, (-0.2, 0.2)),
        ([-0.1, 0.3], (-0.1, 0.3)),
        ("0.2", (-0.2, 0.2)),  # scrapy crawl -s RANDOMIZE_DOWNLOAD_DELAY=0.2
        ("[-0.1, 0.3]", (-0.1, 0.3)),
        (True, (-0.5, 0.5)),
        (1, (-0.5, 0.5)),  # Scrapy reads 0 and 1 as booleans
        ("1", (-0.5, 0.5)),
        (1.0, (-1.0, 1.0)),  # a float is the spec's factor: ±100%
        ("1.0", (-1.0, 1.0)),
        ("0", NO_JITTER),
        ("false", NO_JITTER),
    ],
)
def test_randomize_download_delay_factor_or_pair(value: object, jitter: tuple[float, float]):
    """The spec's RANDOMIZE_DOWNLOAD_DELAY: a factor or a pair, besides Scrapy's boolean."""
    assert read({"RANDOMIZE_DOWNLOAD_DELAY": value}).jitter == jitter


@pytest.mark.parametrize("value", ["sometimes", "[1, 2", [0.5], [0.3, 0.1]])
def test_bad_randomize_download_delay_names_the_setting(value: object):
    with pytest.raises(SettingsError, match="RANDOMIZE_DOWNLOAD_DELAY"):
        read({"RANDOMIZE_DOWNLOAD_DELAY": value})


def test_download_delay_jitter_wins_at_equal_priority():
    """Both set at the same priority: the current setting, DOWNLOAD_DELAY_JITTER, wins."""
    config = read({"RANDOMIZE_DOWNLOAD_DELAY": False, "DOWNLOAD_DELAY_JITTER": 0.3})
    assert config.jitter == (-0.3, 0.3)


def test_randomize_download_delay_wins_at_higher_priority():
    """RANDOMIZE_DOWNLOAD_DELAY set at a higher priority than DOWNLOAD_DELAY_JITTER wins."""
    settings = Settings({"DOWNLOAD_DELAY_JITTER": 0.3})
    settings.set("RANDOMIZE_DOWNLOAD_DELAY", False, priority="cmdline")
    assert ThrottlingSettings.from_settings(settings).jitter == NO_JITTER
    settings.set("RANDOMIZE_DOWNLOAD_DELAY", True, priority="cmdline")
    assert ThrottlingSettings.from_settings(settings).jitter == (-0.5, 0.5)


def test_download_delay_jitter_wins_at_higher_priority():
    """DOWNLOAD_DELAY_JITTER set at a higher priority than RANDOMIZE_DOWNLOAD_DELAY wins."""
    settings = Settings({"RANDOMIZE_DOWNLOAD_DELAY": False})
    settings.set("DOWNLOAD_DELAY_JITTER", 0.1, priority="cmdline")
    assert ThrottlingSettings.from_settings(settings).jitter == (-0.1, 0.1)


# ----------------------------------------------------------------- DOWNLOAD_SLOTS


def test_download_slots_map_onto_scope_options():
    """DOWNLOAD_SLOTS concurrency, delay and jitter become the scope's options."""
    config = read(
        {"DOWNLOAD_SLOTS": {"a.example": {"concurrency": 2, "delay": THREE_DELAY, "jitter": 0.1}}}
    )
    scope = config.scope_config("a.example", DOMAIN)
    assert (scope.concurrency, scope.delay, scope.jitter) == (2, THREE_DELAY, (-0.1, 0.1))
    assert scope.sources["concurrency"] == "DOWNLOAD_SLOTS"
    assert scope.sources["delay"] == "DOWNLOAD_SLOTS"


def test_download_slots_randomize_delay():
    """The older randomize_delay key maps to ±50% or no jitter."""
    config = read(
        {
            "DOWNLOAD_DELAY_JITTER": 0.2,
            "DOWNLOAD_SLOTS": {"on": {"randomize_delay": True}, "off": {"randomize_delay": False}},
        }
    )
    assert config.scope_config("on", DOMAIN).jitter == (-0.5, 0.5)
    assert config.scope_config("off", DOMAIN).jitter == NO_JITTER


def test_download_slots_jitter_beats_randomize_delay():
    """When a slot has both keys, jitter wins over randomize_delay, as in Scrapy."""
    config = read({"DOWNLOAD_SLOTS": {"a": {"jitter": 0.1, "randomize_delay": True}}})
    assert config.scope_config("a", DOMAIN).jitter == (-0.1, 0.1)


def test_download_slots_rejections():
    """Bad DOWNLOAD_SLOTS values are refused, naming the slot."""
    assert "DOWNLOAD_SLOTS['a'] must be a dict" in refuse({"DOWNLOAD_SLOTS": {"a": 2}})
    assert refuse({"DOWNLOAD_SLOTS": {"a": {"delay": -1}}}).startswith(
        "DOWNLOAD_SLOTS['a']['delay'] must be a number >= 0"
    )
    assert refuse({"DOWNLOAD_SLOTS": {"a": {"concurrency": 0}}}).startswith(
        "DOWNLOAD_SLOTS['a']['concurrency'] must be an integer >= 1"
    )


def test_throttling_scopes_override_download_slots():
    """For the same id, THROTTLING_SCOPES wins over DOWNLOAD_SLOTS, key by key."""
    config = read(
        {
            "DOWNLOAD_SLOTS": {"a": {"concurrency": 2, "delay": THREE_DELAY}},
            "THROTTLING_SCOPES": {"a": {"delay": ONE_DELAY}},
        }
    )
    scope = config.scope_config("a", DOMAIN)
    assert (scope.concurrency, scope.delay) == (2, ONE_DELAY)
    assert scope.sources["concurrency"] == "DOWNLOAD_SLOTS"
    assert scope.sources["delay"] == "THROTTLING_SCOPES"


# ----------------------------------------------------------------- resolving one scope


def test_scope_kinds_choose_default_concurrency():
    """domain → CONCURRENT_REQUESTS_PER_DOMAIN, custom → THROTTLING_SCOPE_CONCURRENCY."""
    config = read(
        {
            "CONCURRENT_REQUESTS": 100,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 5,
            "THROTTLING_SCOPE_CONCURRENCY": 3,
        }
    )
    assert config.scope_config("a.example", DOMAIN).concurrency == 5
    assert config.scope_config("api", CUSTOM).concurrency == 3
    assert config.scope_config("10.0.0.1", IP).concurrency == 5  # PER_IP unset: domain default


@PER_IP_DEPRECATED
def test_ip_scopes_use_per_ip_when_set():
    """IP scopes default to CONCURRENT_REQUESTS_PER_IP when it is above 0."""
    config = read({"CONCURRENT_REQUESTS_PER_IP": 2, "CONCURRENT_REQUESTS_PER_DOMAIN": 5})
    assert config.scope_config("10.0.0.1", IP).concurrency == 2
    assert config.scope_config("a.example", DOMAIN).concurrency == 5
    assert config.default_concurrency(IP) == 2


def test_concurrent_requests_caps_scope_concurrency():
    """CONCURRENT_REQUESTS caps every scope's concurrency, and says so in the sources."""
    config = read(
        {
            "CONCURRENT_REQUESTS": 4,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
            "THROTTLING_SCOPES": {"big": {"concurrency": 100, "min_concurrency": 10}},
        }
    )
    domain = config.scope_config("a.example", DOMAIN)
    assert domain.concurrency == 4
    assert domain.sources["concurrency"] == "CONCURRENT_REQUESTS (cap)"
    big = config.scope_config("big", CUSTOM)
    assert big.concurrency == 4
    assert big.min_concurrency == 4  # the floor follows the cap


def test_concurrent_requests_zero_is_no_cap():
    """CONCURRENT_REQUESTS = 0 means no global cap."""
    config = read({"CONCURRENT_REQUESTS": 0, "THROTTLING_SCOPES": {"big": {"concurrency": 100}}})
    assert config.scope_config("big", CUSTOM).concurrency == 100


def test_scope_config_defaults_and_sources():
    """An unconfigured scope takes DOWNLOAD_DELAY and the default jitter, marked as defaults."""
    config = read({"DOWNLOAD_DELAY": 2.0, "DOWNLOAD_DELAY_JITTER": 0})
    scope = config.scope_config("a.example", DOMAIN)
    assert isinstance(scope, ScopeConfig)
    assert (scope.delay, scope.jitter, scope.min_concurrency) == (2.0, NO_JITTER, 1)
    assert scope.manager is None
    assert set(scope.sources.values()) == {"default"}


def test_scope_config_is_frozen():
    """A resolved ScopeConfig cannot be changed in place."""
    scope = read().scope_config("a", DOMAIN)
    with pytest.raises(AttributeError):
        scope.delay = 5.0  # type: ignore[misc]


def test_scope_config_as_dict_is_plain():
    """as_dict() gives the plain values a scope manager's from_crawler receives."""
    config = read({"THROTTLING_SCOPES": {"a": {"concurrency": 3, "delay": 1.5, "jitter": 0.1}}})
    plain = config.scope_config("a", CUSTOM).as_dict()
    assert plain["concurrency"] == 3
    assert plain["delay"] == 1.5
    assert plain["jitter"] == [-0.1, 0.1]
    assert plain["min_concurrency"] == 1


def test_scope_config_as_dict_has_the_documented_keys():
    """docs/rampup-quotas.rst lists the keys a custom manager's config has (a probe
    found them documented nowhere); this keeps the list and the dict together."""
    bare = read().scope_config("a", CUSTOM).as_dict()
    assert set(bare) == {
        "concurrency",
        "min_concurrency",
        "delay",
        "jitter",
        "backoff",
        "window",
        "rampup",
    }
    assert bare["rampup"] is None
    assert set(bare["backoff"]) == {
        "http_codes",
        "exceptions",
        "delay_factor",
        "max_delay",
        "min_delay",
        "jitter",
        "window",
    }
    full = read({"THROTTLING_SCOPES": {"a": {"quota": 5, "rampup": True}}})
    plain = full.scope_config("a", CUSTOM).as_dict()
    assert plain["quota"] == 5.0
    assert set(plain["rampup"]) == {"backoff_target", "delay_factor", "min_delay", "window"}


def test_scope_manager_setting_reaches_every_scope():
    """THROTTLING_SCOPE_MANAGER is the manager of every scope, unless one names its own."""
    config = read(
        {
            "THROTTLING_SCOPE_MANAGER": "slotkit.scope.ThrottlingScopeManager",
            "THROTTLING_SCOPES": {"own": {"manager": f"{OtherManager.__module__}.OtherManager"}},
        }
    )
    from slotkit.scope import ThrottlingScopeManager

    assert config.scope_config("any", CUSTOM).manager is ThrottlingScopeManager
    assert config.scope_config("own", CUSTOM).manager is OtherManager


class OtherManager:
    """A stand-in scope manager class loaded by import path."""


def test_download_slots_unknown_key_warns_like_scrapy_ignores(caplog):
    """Scrapy ignores unknown DOWNLOAD_SLOTS keys; slotkit keeps them working, with a warning."""
    config = read({"DOWNLOAD_SLOTS": {"a": {"concurency": 2, "delay": 1.0}}})
    assert config.scope_config("a", DOMAIN).delay == 1.0
    assert "DOWNLOAD_SLOTS['a'] has an unknown key 'concurency'" in caplog.text
    assert "did you mean 'concurrency'?" in caplog.text


def test_per_ip_limit_is_read_without_scrapys_deprecation_warning():
    """CONCURRENT_REQUESTS_PER_IP means IP scopes in slotkit: reading it is no deprecated use."""
    import warnings

    from slotkit.validation import per_ip_limit

    settings = Settings({"CONCURRENT_REQUESTS_PER_IP": 2})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ThrottlingSettings.from_settings(settings).ip_concurrency == 2
        assert per_ip_limit(settings) == 2
        assert per_ip_limit(Settings()) == 0


@pytest.mark.parametrize("text", ["[1,3]", " [1, 3] "])
def test_pairs_given_on_the_command_line(text: str):
    """`scrapy crawl -s 'BACKOFF_JITTER=[0.1,0.3]'` hands the pair over as a string."""
    assert read({"RAMPUP_BACKOFF_TARGET": text}).rampup_target == (1, 3)
    jitter = text.replace("1", "0.1").replace("3", "0.3")
    assert read({"BACKOFF_JITTER": jitter}).backoff.jitter == (0.1, 0.3)
    assert read({"DOWNLOAD_DELAY_JITTER": jitter}).jitter == (0.1, 0.3)
    assert read({"RANDOMIZE_DOWNLOAD_DELAY": jitter}).jitter == (0.1, 0.3)


def test_an_integer_pair_may_drop_its_brackets():
    assert read({"RAMPUP_BACKOFF_TARGET": "1,3"}).rampup_target == (1, 3)


@pytest.mark.parametrize("name", ["BACKOFF_JITTER", "DOWNLOAD_DELAY_JITTER"])
def test_a_decimal_comma_is_not_taken_for_a_pair(name: str):
    """`0,5` may mean 0.5: refused with the setting's name, never read as [0, 5]."""
    with pytest.raises(SettingsError, match=name):
        read({name: "0,5"})


@pytest.mark.parametrize("text", ["1,x", "[1,2,3]", "[]"])
def test_bad_command_line_pairs_name_the_setting(text: str):
    with pytest.raises(SettingsError, match="RAMPUP_BACKOFF_TARGET") as error:
        read({"RAMPUP_BACKOFF_TARGET": text})
    if text.startswith("["):
        assert repr(text) in str(error.value)  # what the user typed, not the split list


def test_a_misspelt_slotkit_setting_is_named_at_start(caplog):
    """Scrapy ignores a setting nobody reads: a typo of THROTTLING_REDIS_URL would leave
    every worker throttling alone without a word. slotkit names it, with the closest name."""
    from scrapy.utils.test import get_crawler

    from slotkit import Downloader

    settings = {
        "THROTTLING_REDIS_ULR": "redis://127.0.0.1:6379/0",
        "BACKOFF_MINDELAY": 1.0,
        "BACKOFF_MIN_DELAY": 0.5,  # known: not named
        "THROTTLE_SOMETHING": 1,  # not slotkit's prefix: not named
    }
    with caplog.at_level(logging.WARNING, logger="slotkit"):
        downloader = Downloader(get_crawler(settings_dict=settings))
    downloader.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        "slotkit: the setting THROTTLING_REDIS_ULR is not one slotkit reads; "
        "did you mean 'THROTTLING_REDIS_URL'?" in warnings
    )
    assert any("BACKOFF_MINDELAY" in w and "'BACKOFF_MIN_DELAY'" in w for w in warnings)
    assert not any("THROTTLE_SOMETHING" in w or "BACKOFF_MIN_DELAY " in w for w in warnings)


def test_every_documented_setting_is_one_slotkit_reads():
    """docs/settings.rst and the names slotkit knows (for the misspelling warning) agree."""
    import re
    from pathlib import Path

    from slotkit.setting_names import SETTING_NAMES

    text = (Path(__file__).resolve().parent.parent / "docs" / "settings.rst").read_text()
    documented = set(re.findall(r"``((?:THROTTLING|BACKOFF|RAMPUP)_[A-Z_]+)``", text))
    assert documented == SETTING_NAMES


def test_a_jitter_above_one_is_accepted_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Acceptance probe: {"jitter": 2} started silently and sent bursts (5 of 19
    gaps 0 s). Scrapy accepts it too, so it is a warning, not an error."""
    with caplog.at_level("WARNING", logger="slotkit"):
        config = read({"THROTTLING_SCOPES": {"a.example": {"delay": 0.5, "jitter": 2}}})
    assert config.scope_config("a.example", DOMAIN).jitter == (-2.0, 2.0)
    assert "THROTTLING_SCOPES['a.example']['jitter'] = 2 reaches below a zero delay" in caplog.text
    # A scope manager rebuilt from the config (the shared mode's) reads the pair back.
    assert parse_jitter("jitter", [-2.0, 2.0]) == (-2.0, 2.0)


def test_a_python_literal_on_the_command_line_is_told_what_json_wants():
    """-s "THROTTLING_SCOPES={'a': {'delay': 0.5}}" (Python, not JSON) said only
    'must be a dict, or JSON text of one'."""
    message = refuse({"THROTTLING_SCOPES": "{'a': {'delay': 0.5}}"})
    assert "not valid JSON" in message
    assert "JSON wants double quotes and true/false/null" in message
    # Valid JSON that is no object gets no quoting advice.
    message = refuse({"THROTTLING_SCOPES": '["a", 1]'})
    assert "valid JSON, but not an object" in message


def test_a_quota_scope_without_concurrency_is_told_it_sends_one_at_a_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An API-user probe: {"api": {"quota": 20, "window": 2}} with 0.5 s answers spent
    a fifth of the quota (concurrency 1, THROTTLING_SCOPE_CONCURRENCY's default) with
    nothing said. Sites, scopes given a concurrency or a default, and managers of
    their own are not told."""
    with caplog.at_level(logging.WARNING, logger="slotkit"):
        read({"THROTTLING_SCOPES": {"serial-api": {"quota": 20, "window": 2}}})
        read({"THROTTLING_SCOPES": {"serial-api": {"quota": 20, "window": 2}}})
    assert caplog.text.count("THROTTLING_SCOPES['serial-api'] has a quota but no") == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="slotkit"):
        read({"THROTTLING_SCOPES": {"api.example.com": {"quota": 20}}})
        read({"THROTTLING_SCOPES": {"sized-api": {"quota": 20, "concurrency": 4}}})
        read({"THROTTLING_SCOPES": {"default-api": {"quota": 20}}}, THROTTLING_SCOPE_CONCURRENCY=4)
        read(
            {
                "THROTTLING_SCOPES": {"slot-api": {"quota": 20}},
                "DOWNLOAD_SLOTS": {"slot-api": {"concurrency": 4}},
            }
        )
        read({"THROTTLING_SCOPES": {"one-api": {"quota": 20}}, "CONCURRENT_REQUESTS": 1})
        read({"THROTTLING_SCOPES": {"single-api": {"quota": 1}}})
    assert "has a quota but no" not in caplog.text


def test_each_crawl_is_told_of_its_settings_once(caplog: pytest.LogCaptureFixture) -> None:
    """The warnings were said once per process: a second crawl in the same
    process (CrawlerProcess with two spiders, a test session) heard nothing."""
    settings = {
        "THROTTLING_SCOPES": {"A.test": {"concurrency": 1}, "api": {"quota": 10}},
        "DOWNLOAD_DELAY_JITTER": [-2, 0],
    }
    told = []
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="slotkit"):
            Downloader(get_crawler(settings_dict=settings), clock=Clock())
        told.append(caplog.text)
    for text in told:
        assert text.count("key 'A.test' is no site's scope id") == 1
        assert text.count("reaches below a zero delay") == 1
        assert text.count("THROTTLING_SCOPES['api'] has a quota but no 'concurrency'") == 1


@pytest.mark.parametrize(
    ("settings", "source"),
    [
        ({"CONCURRENT_REQUESTS_PER_DOMAIN": 2}, "CONCURRENT_REQUESTS_PER_DOMAIN"),
        ({"DOWNLOAD_SLOTS": {"h.test": {"concurrency": 2}}}, "DOWNLOAD_SLOTS"),
        ({"CONCURRENT_REQUESTS": 2}, "the CONCURRENT_REQUESTS cap"),
    ],
)
def test_a_floor_above_the_concurrency_from_elsewhere_is_warned_about(
    settings: dict[str, Any], source: str, caplog: pytest.LogCaptureFixture
):
    """min_concurrency 3 beside a concurrency of 2 is refused; given 2 by another
    setting it was lowered without a word (an acceptance probe)."""
    forget_setting_warnings()
    with caplog.at_level(logging.WARNING, logger="slotkit"):
        read({"THROTTLING_SCOPES": {"h.test": {"min_concurrency": 3}}, **settings})
    assert (
        "THROTTLING_SCOPES['h.test']['min_concurrency'] (3) is above the scope's "
        f"concurrency (2, from {source}); it is lowered to 2"
    ) in caplog.text


def test_a_download_slots_key_with_a_floor_is_a_site(caplog: pytest.LogCaptureFixture):
    """DOWNLOAD_SLOTS keys are sites whatever their id looks like: 'api' with a
    min_concurrency of 4 gets CONCURRENT_REQUESTS_PER_DOMAIN (8), not the
    custom scopes' 1 the warning assumed (a review)."""
    forget_setting_warnings()
    with caplog.at_level(logging.WARNING, logger="slotkit"):
        read(
            {
                "DOWNLOAD_SLOTS": {"api": {"delay": 0.5}},
                "THROTTLING_SCOPES": {"api": {"min_concurrency": 4}},
            }
        )
    assert "min_concurrency" not in caplog.text


def test_a_grouping_is_not_guessed_from_one_word():
    """'subdomain' means per host, not 'registrable_domain', which shares a word."""
    message = refuse({"THROTTLING_DOMAIN_GROUPING": "subdomain"})
    assert "did you mean" not in message
