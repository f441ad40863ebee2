"""Tests for ``python -m slotkit`` (slotkit.cli): ``explain`` and the subcommand layout."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from slotkit import cli
from slotkit.cli import main

REPO = Path(__file__).resolve().parent.parent


RETRY_MIDDLEWARE = "scrapy.downloadermiddlewares.retry.RetryMiddleware"


@pytest.fixture(autouse=True)
def _outside_any_scrapy_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands read a Scrapy project's settings when they find one (a
    scrapy.cfg above the working directory, SCRAPY_SETTINGS_MODULE): a
    developer's shell or checkout must not change what these tests see."""
    monkeypatch.delenv("SCRAPY_SETTINGS_MODULE", raising=False)
    monkeypatch.chdir(tmp_path)


def explain_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    """Run ``explain --json`` in-process; return the parsed explanation."""
    status = main(["explain", "--json", *args])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    return json.loads(captured.out)  # type: ignore[no-any-return]


def scope_of(data: dict[str, Any], scope_id: str) -> dict[str, Any]:
    (scope,) = [scope for scope in data["scopes"] if scope["id"] == scope_id]
    return scope  # type: ignore[no-any-return]


def limit(data: dict[str, Any], scope_id: str, name: str) -> tuple[Any, str]:
    value = scope_of(data, scope_id)["limits"][name]
    return value["value"], value["source"]


@pytest.fixture
def settings_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write a settings module under a unique name; return a function making one."""
    monkeypatch.syspath_prepend(str(tmp_path))
    counter = iter(range(1000))

    def make(source: str) -> str:
        name = f"slotkit_cli_settings_{next(counter)}_{abs(hash(tmp_path)) % 10**6}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
        return name

    return make


# ----------------------------------------------------------------- the spec's examples


def test_default_scope_is_the_host_name(capsys):
    """Without any setting a request gets one domain scope named after its host."""
    data = explain_json(capsys, "https://books.toscrape.com/catalogue/page-2.html")
    assert [scope["id"] for scope in data["scopes"]] == ["books.toscrape.com"]
    scope = data["scopes"][0]
    assert (scope["kind"], scope["primary"]) == ("domain", True)
    assert limit(data, "books.toscrape.com", "concurrency") == (
        8,
        "CONCURRENT_REQUESTS_PER_DOMAIN (Scrapy default)",
    )
    assert limit(data, "books.toscrape.com", "delay") == (0, "DOWNLOAD_DELAY (Scrapy default)")
    assert limit(data, "books.toscrape.com", "min_concurrency") == (1, "slotkit default")


def test_each_subdomain_is_its_own_scope(capsys):
    """books.toscrape.com and toscrape.com are different scopes."""
    sub = explain_json(capsys, "https://books.toscrape.com/")
    top = explain_json(capsys, "https://toscrape.com/")
    assert sub["scopes"][0]["id"] == "books.toscrape.com"
    assert top["scopes"][0]["id"] == "toscrape.com"


def test_throttling_scopes_override(capsys):
    """A THROTTLING_SCOPES entry wins over the defaults and is named as the source."""
    data = explain_json(
        capsys,
        "https://quotes.toscrape.com/page/1/",
        "-s",
        'THROTTLING_SCOPES={"quotes.toscrape.com": {"concurrency": 16, "delay": 0.0}}',
    )
    source = "THROTTLING_SCOPES['quotes.toscrape.com'] (-s on the command line)"
    assert limit(data, "quotes.toscrape.com", "concurrency") == (16, source)
    assert limit(data, "quotes.toscrape.com", "delay") == (0.0, source)
    assert limit(data, "quotes.toscrape.com", "jitter")[1] == (
        "DOWNLOAD_DELAY_JITTER (Scrapy default)"
    )


def test_download_slots_mapping(capsys):
    """DOWNLOAD_SLOTS keeps its meaning: its concurrency and delay apply to the scope."""
    data = explain_json(
        capsys,
        "https://example.com/",
        "-s",
        'DOWNLOAD_SLOTS={"example.com": '
        '{"concurrency": 3, "delay": 2.5, "randomize_delay": false}}',
    )
    source = "DOWNLOAD_SLOTS['example.com'] (-s on the command line)"
    assert limit(data, "example.com", "concurrency") == (3, source)
    assert limit(data, "example.com", "delay") == (2.5, source)
    assert limit(data, "example.com", "jitter") == ([0.0, 0.0], source)


def test_throttling_scopes_win_over_download_slots(capsys):
    """Where both name a scope, THROTTLING_SCOPES wins key by key."""
    data = explain_json(
        capsys,
        "https://example.com/",
        "-s",
        'DOWNLOAD_SLOTS={"example.com": {"concurrency": 3, "delay": 2.5}}',
        "-s",
        'THROTTLING_SCOPES={"example.com": {"delay": 1.0}}',
    )
    assert limit(data, "example.com", "concurrency")[1].startswith("DOWNLOAD_SLOTS")
    assert limit(data, "example.com", "delay") == (
        1.0,
        "THROTTLING_SCOPES['example.com'] (-s on the command line)",
    )


def test_concurrent_requests_caps_the_scope(capsys):
    """CONCURRENT_REQUESTS caps a scope's concurrency; the explanation says what it capped."""
    data = explain_json(
        capsys,
        "https://api.toscrape.com/",
        "-s",
        'THROTTLING_SCOPES={"api.toscrape.com": {"concurrency": 1000, "delay": 0.08}}',
        "-s",
        "CONCURRENT_REQUESTS=32",
    )
    value, source = limit(data, "api.toscrape.com", "concurrency")
    assert value == 32
    assert source.startswith("capped by CONCURRENT_REQUESTS (-s on the command line)")
    assert "1000 from THROTTLING_SCOPES['api.toscrape.com']" in source


def test_concurrent_requests_caps_the_per_domain_default(capsys):
    """The cap applies to the default too: 8 per domain under CONCURRENT_REQUESTS=4 is 4."""
    data = explain_json(capsys, "https://example.com/", "-s", "CONCURRENT_REQUESTS=4")
    value, source = limit(data, "example.com", "concurrency")
    assert value == 4
    assert "8 from CONCURRENT_REQUESTS_PER_DOMAIN (Scrapy default)" in source


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        ((), "on where RetryMiddleware retries (RETRY_TIMES 2, 429 retried), for up to 180 s"),
        (("-s", "RETRY_ENABLED=False"), "off (RETRY_ENABLED is False)"),
        (
            (
                "-s",
                "DOWNLOADER_MIDDLEWARES=" + json.dumps({RETRY_MIDDLEWARE: None}),
            ),
            "off (no RetryMiddleware among DOWNLOADER_MIDDLEWARES)",
        ),
        (("-s", "BACKOFF_RESEND=False"), "off"),
    ],
)
def test_explain_says_whether_rate_limited_responses_are_re_sent(capsys, args, shown):
    data = explain_json(capsys, "https://example.com/", *args)
    assert data["crawl"]["BACKOFF_RESEND"]["shown"] == shown


def test_typo_in_a_scope_key_exits_2_with_the_suggestion(capsys):
    """A misspelt THROTTLING_SCOPES key is a SettingsError: exit 2, the hint, no traceback."""
    status = main(
        [
            "explain",
            "https://example.com/",
            "-s",
            'THROTTLING_SCOPES={"example.com": {"concurency": 2}}',
        ]
    )
    captured = capsys.readouterr()
    assert status == 2
    assert captured.out == ""
    assert captured.err.startswith("error: THROTTLING_SCOPES['example.com'] has an unknown key")
    assert "did you mean 'concurrency'?" in captured.err
    assert "Traceback" not in captured.err


def test_bad_value_exits_2(capsys):
    """A value of the wrong type names the setting, what arrived, and exits 2."""
    status = main(["explain", "https://example.com/", "-s", "DOWNLOAD_DELAY=soon"])
    captured = capsys.readouterr()
    assert status == 2
    assert "DOWNLOAD_DELAY must be a number" in captured.err


# ----------------------------------------------------------------- more sources


def test_backoff_sources(capsys):
    """Backoff values come from BACKOFF_* or from the scope's "backoff" dict, key by key."""
    data = explain_json(
        capsys,
        "https://example.com/",
        "-s",
        'THROTTLING_SCOPES={"example.com": {"backoff": {"max_delay": 180, "http_codes": [429]}}}',
        "-s",
        "BACKOFF_DELAY_FACTOR=3",
    )
    backoff = scope_of(data, "example.com")["backoff"]
    assert backoff["max_delay"]["value"] == 180
    assert backoff["max_delay"]["source"].startswith("THROTTLING_SCOPES['example.com']['backoff']")
    assert backoff["http_codes"]["value"] == [429]
    assert backoff["delay_factor"] == {
        "value": 3.0,
        "shown": "x3",
        "source": "BACKOFF_DELAY_FACTOR (-s on the command line)",
    }
    assert backoff["min_delay"]["source"] == "BACKOFF_MIN_DELAY (slotkit default)"


def test_randomize_download_delay_false_shows_no_jitter(capsys):
    """RANDOMIZE_DOWNLOAD_DELAY=False set explicitly wins over the default jitter."""
    data = explain_json(capsys, "https://example.com/", "-s", "RANDOMIZE_DOWNLOAD_DELAY=False")
    assert limit(data, "example.com", "jitter") == (
        [0.0, 0.0],
        "RANDOMIZE_DOWNLOAD_DELAY (-s on the command line)",
    )


def test_settings_module_then_command_line(capsys, settings_module):
    """--settings-module applies at project priority; -s overrides it."""
    name = settings_module(
        """
        DOWNLOAD_DELAY = 2.0
        CONCURRENT_REQUESTS_PER_DOMAIN = 3
        DOWNLOADER = "slotkit.Downloader"
        """
    )
    data = explain_json(
        capsys,
        "https://example.com/",
        "--settings-module",
        name,
        "-s",
        "CONCURRENT_REQUESTS_PER_DOMAIN=5",
    )
    assert limit(data, "example.com", "delay") == (2.0, "DOWNLOAD_DELAY (project settings)")
    assert limit(data, "example.com", "concurrency") == (
        5,
        "CONCURRENT_REQUESTS_PER_DOMAIN (-s on the command line)",
    )
    assert data["notes"] == []


def test_missing_settings_module_exits_2(capsys):
    """An unimportable --settings-module is a usage error."""
    status = main(["explain", "https://example.com/", "--settings-module", "no_such_mod_xyz"])
    assert status == 2
    assert "no_such_mod_xyz" in capsys.readouterr().err


def test_custom_sync_throttling_manager_is_honoured(capsys, settings_module):
    """A THROTTLING_MANAGER from the settings decides the scopes; custom ones get
    THROTTLING_SCOPE_CONCURRENCY."""
    name = settings_module(
        """
        from slotkit import ThrottlingManager, add_scope

        class CostManager(ThrottlingManager):
            def get_scopes(self, request):
                return add_scope(super().get_scopes(request), "cost", 3.5)

        THROTTLING_MANAGER = CostManager
        THROTTLING_SCOPE_CONCURRENCY = 2
        """
    )
    data = explain_json(capsys, "https://api.toscrape.com/?q=1", "--settings-module", name)
    assert data["manager"] == f"{name}.CostManager"
    assert [(s["id"], s["kind"], s["amount"]) for s in data["scopes"]] == [
        ("api.toscrape.com", "domain", None),
        ("cost", "custom", 3.5),
    ]
    assert limit(data, "cost", "concurrency") == (
        2,
        "THROTTLING_SCOPE_CONCURRENCY (project settings)",
    )


def test_async_manager_that_needs_no_io_is_run(capsys, settings_module):
    """An ``async def get_scopes`` that awaits nothing slow is run to completion."""
    name = settings_module(
        """
        from slotkit import ThrottlingManager

        class AsyncManager(ThrottlingManager):
            async def get_scopes(self, request):
                return ["api", "users"]

        THROTTLING_MANAGER = AsyncManager
        """
    )
    data = explain_json(capsys, "https://api.example/users", "--settings-module", name)
    assert [scope["id"] for scope in data["scopes"]] == ["api", "users"]
    assert data["manager_note"] is None


def test_spec_style_async_manager_awaiting_super(capsys, settings_module):
    """The spec's recipe shape (``@scope_cache async def`` awaiting super()) is explained."""
    name = settings_module(
        """
        from slotkit import ThrottlingManager, add_scope, scope_cache

        class ApiManager(ThrottlingManager):
            @scope_cache
            async def get_scopes(self, request):
                scopes = await super().get_scopes(request)
                return add_scope(scopes, "example.com")

        THROTTLING_MANAGER = ApiManager
        """
    )
    data = explain_json(
        capsys, "https://api.toscrape.com/?url=https://example.com", "--settings-module", name
    )
    assert [scope["id"] for scope in data["scopes"]] == ["api.toscrape.com", "example.com"]
    assert data["manager_note"] is None


def test_async_manager_waiting_for_io_falls_back_to_the_defaults(capsys, settings_module):
    """A get_scopes that really waits cannot run here: the default scopes are shown, with a note."""
    name = settings_module(
        """
        from twisted.internet.defer import Deferred
        from slotkit import ThrottlingManager

        class WaitingManager(ThrottlingManager):
            async def get_scopes(self, request):
                await Deferred()
                return "never"

        THROTTLING_MANAGER = WaitingManager
        """
    )
    data = explain_json(capsys, "https://example.com/", "--settings-module", name)
    assert [scope["id"] for scope in data["scopes"]] == ["example.com"]
    assert "waits for I/O" in data["manager_note"]


def test_async_manager_awaiting_asyncio_io_is_explained(capsys, settings_module):
    """The spec's per-IP recipe awaits run_in_thread (a DNS lookup): explain runs it
    on an asyncio loop, as a crawl would (it failed: no reactor installed)."""
    name = settings_module(
        """
        from scrapy.utils.asyncio import run_in_thread
        from slotkit import ThrottlingManager

        class ThreadManager(ThrottlingManager):
            async def get_scopes(self, request):
                host = await run_in_thread(str.lower, "EXAMPLE.COM")
                return {host, "10.0.0.1"}

        THROTTLING_MANAGER = ThreadManager
        """
    )
    data = explain_json(capsys, "https://example.com/", "--settings-module", name)
    assert sorted(scope["id"] for scope in data["scopes"]) == ["10.0.0.1", "example.com"]
    assert data["manager_note"] is None


def test_a_manager_with_only_get_request_scopes_is_explained(capsys, settings_module):
    """The spec's "alternative domain throttling" managers define get_request_scopes
    alone; crawls take them, and explain crashed on the missing get_scopes."""
    name = settings_module(
        """
        class MyThrottlingManager:
            def get_request_scopes(self, request):
                return {"toscrape.com"}

        THROTTLING_MANAGER = MyThrottlingManager
        """
    )
    data = explain_json(capsys, "http://books.toscrape.com/", "--settings-module", name)
    assert [scope["id"] for scope in data["scopes"]] == ["toscrape.com"]


def test_meta_selects_scopes(capsys):
    """--meta gives the request meta the default manager reads (throttling_scopes)."""
    data = explain_json(
        capsys,
        "https://api.example/users",
        "--meta",
        '{"throttling_scopes": {"api": 1, "users": 2}}',
        "-s",
        'THROTTLING_SCOPES={"api": {"concurrency": 2}, "users": {"delay": 5.0}}',
    )
    assert [(s["id"], s["amount"]) for s in data["scopes"]] == [("api", 1.0), ("users", 2.0)]
    assert limit(data, "api", "concurrency")[0] == 2
    assert limit(data, "users", "delay")[0] == 5.0


def test_a_misspelt_meta_key_is_named(capsys):
    """A review: explain quietly showed the host's scope, where a user would go to look."""
    data = explain_json(capsys, "https://a.example/", "--meta", '{"throttle_scopes": "api"}')
    assert [scope["id"] for scope in data["scopes"]] == ["a.example"]
    assert (
        "--meta key 'throttle_scopes' is ignored: slotkit does not read it "
        "(did you mean 'throttling_scopes'?)" in data["notes"]
    )


@pytest.mark.parametrize(
    "meta",
    ['{"throttling_scopes": 5}', '{"throttling_scopes": {"a": -1}}', '{"throttling_scopes": ""}'],
)
def test_a_bad_throttling_scopes_meta_is_blamed_on_the_meta(capsys, meta):
    """Not on a get_scopes() the user never wrote."""
    status = main(["explain", "https://example.com/", "--meta", meta])
    captured = capsys.readouterr()
    assert status == 2
    assert captured.err.startswith("error: the throttling_scopes meta (--meta) ")


def test_download_slot_meta_is_a_domain_scope(capsys):
    """A user's download_slot meta names the scope and counts as a domain (per-domain default)."""
    data = explain_json(capsys, "https://example.com/", "--meta", '{"download_slot": "shared"}')
    assert [(s["id"], s["kind"]) for s in data["scopes"]] == [("shared", "domain")]
    assert limit(data, "shared", "concurrency")[0] == 8


def test_notes_for_the_downloader_robots_and_autothrottle(capsys):
    """Notes warn about a non-slotkit DOWNLOADER, ROBOTSTXT_OBEY and AutoThrottle."""
    data = explain_json(
        capsys,
        "https://example.com/",
        "-s",
        "ROBOTSTXT_OBEY=True",
        "-s",
        "AUTOTHROTTLE_ENABLED=True",
    )
    notes = " | ".join(data["notes"])
    assert "DOWNLOADER is 'scrapy.core.downloader.Downloader'" in notes
    assert "Crawl-delay" in notes
    assert "AUTOTHROTTLE_ENABLED" in notes


def test_autothrottle_max_delay_is_shown_as_its_source(capsys):
    """The backoff cap AUTOTHROTTLE_MAX_DELAY sets is labelled as the mapping, not a default."""
    data = explain_json(
        capsys,
        "https://example.com/",
        "-s",
        "AUTOTHROTTLE_ENABLED=True",
        "-s",
        "AUTOTHROTTLE_MAX_DELAY=10",
    )
    backoff = scope_of(data, "example.com")["backoff"]["max_delay"]
    assert backoff["value"] == 10.0
    assert backoff["source"] == "AUTOTHROTTLE_MAX_DELAY (AutoThrottle mapping)"
    assert "keeps Scrapy's AutoThrottle from changing delays" in " | ".join(data["notes"])


def test_addons_are_applied(capsys):
    """ADDONS take part: with slotkit's add-on the DOWNLOADER note goes away."""
    data = explain_json(capsys, "https://example.com/", "-s", 'ADDONS={"slotkit.addon.Addon": 0}')
    assert data["notes"] == []


def test_text_output(capsys):
    """The text form lists the scope, each value and its source, then crawl-wide values."""
    status = main(["explain", "https://books.toscrape.com/", "-s", "DOWNLOAD_DELAY=1.5"])
    out = capsys.readouterr().out
    assert status == 0
    assert "1 scope: books.toscrape.com" in out
    assert "Scope 'books.toscrape.com' (domain scope; primary: reported as download_slot)" in out
    delay_line = next(line for line in out.splitlines() if line.strip().startswith("delay"))
    assert delay_line.split() == [
        "delay",
        "1.5",
        "s",
        "DOWNLOAD_DELAY",
        "(-s",
        "on",
        "the",
        "command",
        "line)",
    ]
    assert "Crawl-wide" in out
    assert "THROTTLING_STATS_INTERVAL" in out


def test_unknown_setting_name_warns_with_a_suggestion(capsys):
    """-s with a name neither Scrapy nor slotkit knows warns, suggesting the close one."""
    status = main(["explain", "https://example.com/", "-s", "THROTTLING_SCOPE_CONCURENCY=2"])
    err = capsys.readouterr().err
    assert status == 0
    assert "did you mean THROTTLING_SCOPE_CONCURRENCY?" in err


@pytest.mark.parametrize(
    "setting",
    [
        "THROTTLING_DOMAIN_GROUPING=registrable_domain",
        "THROTTLING_REDIS_URL=local",
        "THROTTLING_REDIS_NAMESPACE=x",
        "THROTTLING_REDIS_TIMEOUT=0.5",
    ],
)
def test_every_documented_setting_is_known_to_the_command_line(capsys, setting):
    """A probe: these were called unknown by -s, though the crawl reads them."""
    assert main(["explain", "https://example.com/", "-s", setting]) == 0
    assert "not a setting" not in capsys.readouterr().err


def test_a_misspelt_redis_setting_is_suggested_its_name(capsys):
    """The docs' own typo example, caught at crawl start, is caught by -s too."""
    main(["explain", "https://example.com/", "-s", "THROTTLING_REDIS_ULR=local"])
    assert "did you mean THROTTLING_REDIS_URL?" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            "THROTTLING_SCOPE_MANAGER=tests.test_downloader_unit.HalfScopeManager",
            "THROTTLING_SCOPE_MANAGER names",
        ),
        (
            'THROTTLING_SCOPES={"api": {"manager": "tests.test_downloader_unit.HalfScopeManager"}}',
            "THROTTLING_SCOPES['api']['manager'] names",
        ),
        ("THROTTLING_REDIS_URL=http://x", "THROTTLING_REDIS_URL must be a redis://"),
        ("THROTTLING_REDIS_TIMEOUT=-1", "THROTTLING_REDIS_TIMEOUT must be"),
    ],
)
def test_explain_refuses_what_the_crawl_refuses(capsys, setting, message):
    """A probe: explain exited 0 on these, which a crawl refuses at start (cli.rst
    promises the crawl's message and status 2)."""
    assert main(["explain", "https://example.com/", "-s", setting]) == 2
    assert message in capsys.readouterr().err


def test_invalid_json_value_exits_2(capsys):
    """A value that starts like JSON but is not valid JSON is refused."""
    status = main(["explain", "https://example.com/", "-s", "THROTTLING_SCOPES={'a': 1}"])
    assert status == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_bad_url_exits_2(capsys):
    """A URL Scrapy cannot build a Request for is a usage error."""
    status = main(["explain", "example.com/no-scheme"])
    assert status == 2
    assert "cannot build a request" in capsys.readouterr().err


def test_parse_setting_keeps_strings_like_scrapy():
    """Plain values stay strings (Scrapy converts them when read); JSON for dicts/lists."""
    assert cli.parse_setting("DOWNLOAD_DELAY=2") == ("DOWNLOAD_DELAY", "2")
    assert cli.parse_setting("A= [1, 2]") == ("A", [1, 2])
    assert cli.parse_setting('B={"x": {"y": 1}}') == ("B", {"x": {"y": 1}})
    assert cli.parse_setting("C=a=b") == ("C", "a=b")
    with pytest.raises(cli.CommandError):
        cli.parse_setting("NOEQUALS")


# ----------------------------------------------------------------- layout


def test_a_subcommand_is_one_register_function(monkeypatch, capsys):
    """Adding a subcommand (e.g. migrate) is one function listed in COMMANDS."""

    def register(subparsers: Any) -> None:
        parser = subparsers.add_parser("hello")
        parser.add_argument("name")
        parser.set_defaults(handler=lambda args: print(f"hi {args.name}") or 0)

    monkeypatch.setattr(cli, "COMMANDS", [*cli.COMMANDS, register])
    assert main(["hello", "you"]) == 0
    assert capsys.readouterr().out == "hi you\n"


def test_no_subcommand_is_a_usage_error(capsys):
    """Without a subcommand argparse exits 2 with the usage."""
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
    assert "usage: python -m slotkit" in capsys.readouterr().err


def test_python_dash_m_slotkit_runs_explain():
    """``python -m slotkit explain`` works as a real command (through __main__)."""
    done = subprocess.run(
        [sys.executable, "-m", "slotkit", "explain", "https://example.com/"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Scope 'example.com'" in done.stdout


def test_python_dash_m_slotkit_bad_setting_exit_status():
    """A bad setting gives exit status 2 and a one-line error, no traceback, as a command."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "slotkit",
            "explain",
            "https://example.com/",
            "-s",
            'THROTTLING_SCOPES={"example.com": {"dealy": 1}}',
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "did you mean 'delay'?" in done.stderr
    assert "Traceback" not in done.stderr


def test_migrate_prints_the_equivalents(capsys: pytest.CaptureFixture[str]) -> None:
    """`migrate` turns AutoThrottle and DOWNLOAD_SLOTS settings into slotkit's, with notes."""
    status = main(
        [
            "migrate",
            "-s",
            "AUTOTHROTTLE_ENABLED=True",
            "-s",
            "AUTOTHROTTLE_START_DELAY=2",
            "-s",
            'DOWNLOAD_SLOTS={"a.example": {"delay": 3}}',
        ]
    )
    out = capsys.readouterr().out
    assert status == 0
    assert "DOWNLOADER = 'slotkit.Downloader'" in out
    assert "DOWNLOAD_DELAY = 2.0" in out
    assert "# from AUTOTHROTTLE_MAX_DELAY" in out
    assert "THROTTLING_SCOPES = {'a.example': {'delay': 3}}" in out


@pytest.mark.parametrize(("url", "scope"), [("127.0.0.1:8124", "127.0.0.1"), ("[::1]:8124", "::1")])
def test_an_address_in_the_url_is_explained_as_the_ip_scope_the_crawl_uses(capsys, url, scope):
    """With CONCURRENT_REQUESTS_PER_IP, a URL's own address is an IP scope limited by it
    (as the downloader has it); the setting is known; names get a note about the lookup.
    An IPv6 address, which has no dot, was explained as a single-label site."""
    args = ["explain", "--json", f"http://{url}/x", "-s", "CONCURRENT_REQUESTS_PER_IP=1"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "not a setting" not in captured.err
    data = json.loads(captured.out)
    assert scope_of(data, scope)["kind"] == "ip"
    value, source = limit(data, scope, "concurrency")
    assert (value, source.split()[0]) == (1, "CONCURRENT_REQUESTS_PER_IP")
    if scope != "127.0.0.1":
        return
    assert any("looked up once" in note for note in data["notes"])
    plain = explain_json(capsys, "http://127.0.0.1:8124/x")
    assert limit(plain, "127.0.0.1", "concurrency")[0] == 8


def test_inside_a_scrapy_project_its_settings_are_read(tmp_path, monkeypatch, capsys):
    """Like ``scrapy`` commands, explain and migrate find the project (scrapy.cfg) on their
    own; before, they showed Scrapy's defaults unless given --settings-module."""
    package = tmp_path / "cliproject"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "settings.py").write_text(
        'DOWNLOAD_SLOTS = {"example.com": {"concurrency": 2, "delay": 1.0}}\n'
    )
    (tmp_path / "scrapy.cfg").write_text("[settings]\ndefault = cliproject.settings\n")
    monkeypatch.chdir(tmp_path)
    # Scrapy sets SCRAPY_SETTINGS_MODULE when it finds the project: setting it
    # first has monkeypatch remove it afterwards, so later tests see no project.
    monkeypatch.setenv("SCRAPY_SETTINGS_MODULE", "")
    monkeypatch.delenv("SCRAPY_SETTINGS_MODULE")
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        main(["explain", "http://example.com/", "--json"])
    finally:
        sys.modules.pop("cliproject.settings", None)
        sys.modules.pop("cliproject", None)
    scope = json.loads(capsys.readouterr().out)["scopes"][0]
    assert scope["limits"]["concurrency"]["value"] == 2
    assert "project settings" in scope["limits"]["concurrency"]["source"]


def test_a_dict_setting_given_plain_text_exits_2(capsys):
    """An acceptance probe: ``-s DOWNLOAD_SLOTS=notjson`` ended explain in a traceback."""
    status = main(["explain", "https://example.com/", "-s", "DOWNLOAD_SLOTS=notjson"])
    assert status == 2
    assert "-s DOWNLOAD_SLOTS" in capsys.readouterr().err


def test_explain_names_a_misspelt_setting(capsys):
    """The crawl warns of THROTTLING_SCOPE (no S) at start; explain, the tool a user
    runs to see why a value is not theirs, said nothing."""
    data = explain_json(
        capsys, "https://example.com/", "-s", 'THROTTLING_SCOPE={"example.com": {"delay": 2}}'
    )
    assert any(
        "THROTTLING_SCOPE is not one slotkit reads" in note and "THROTTLING_SCOPES" in note
        for note in data["notes"]
    ), data["notes"]
