"""The Lua script against a real redis-server, and its Python twin on the same inputs."""

from __future__ import annotations

import random

import pytest
from twisted.internet.task import Clock

from slotkit.shared.client import script_source
from slotkit.shared.twin import TwinStore, fmt
from tests.test_shared_support import redis_server  # noqa: F401 - a fixture

NS = "{t}:"
WORKERS = NS + "w"


def keys(*scopes: str) -> list[str]:
    out = [WORKERS]
    for scope in scopes:
        out += [f"{NS}s:{scope}", f"{NS}l:{scope}"]
    return out


def acquire_argv(now, worker, lease, scopes, *, horizon=30.0, lease_ttl=10.0):
    argv = ["acquire", fmt(now), worker, fmt(5.0), "0", lease, fmt(lease_ttl), fmt(horizon)]
    argv += [fmt(600.0), str(len(scopes))]
    for s in scopes:
        argv += [
            fmt(s.get("amount", 1.0)),
            fmt(s.get("delay", 1.0)),
            str(s.get("concurrency", 2)),
            fmt(s.get("quota", -1.0)),
            fmt(s.get("window", 10.0)),
            fmt(s.get("cd", 0.0)),
            fmt(2.0),
            fmt(1.0),
            fmt(60.0),
            fmt(s.get("bwin", 5.0)),
            fmt(s.get("jf", 1.0)),
            *rampup_args(s),
        ]
    return argv


def with_releases(k, argv, lease, scopes, concs):
    """*argv* with *lease* given back in *scopes*, its lease sets appended to the keys."""
    k = list(k)
    triples = []
    for scope, conc in zip(scopes, concs, strict=True):
        lkey = f"{NS}l:{scope}"
        if lkey not in k:
            k += [f"{NS}s:{scope}", lkey]
        triples += [lease, str(k.index(lkey) + 1), str(conc)]
    return k, [*argv[:4], str(len(scopes)), *triples, *argv[5:]]


def one_scope_head(op, now, worker):
    """How one-scope ``backoff`` / ``quota`` calls start: no releases, key TTL, 1 scope."""
    return [op, fmt(now), worker, fmt(5.0), "0", fmt(600.0), "1"]


def backoff_argv(now, worker, hold, age, delay=1.0, cd=0.0, bwin=5.0, scope=None):
    """One ``backoff`` call; *scope* (a config of ``random_ops``) adds its rampup arguments."""
    s = scope or {}
    return [
        *one_scope_head("backoff", now, worker),
        fmt(hold),
        fmt(age),
        fmt(s.get("delay", delay)),
        fmt(cd),
        fmt(2.0),
        fmt(1.0),
        fmt(60.0),
        fmt(bwin),
        *rampup_args(s),
        str(s.get("concurrency", 2)),
        str(s.get("rhigh", 2) if s.get("rampup") else -1),
    ]


def rampup_args(s):
    """The six rampup arguments, as ``acquire`` and ``backoff`` take them."""
    return [
        "1" if s.get("rampup") else "0",
        "1",
        fmt(0.5),
        fmt(s.get("rmin", 0.1)),
        fmt(s.get("rwin", 3.0)),
        str(s.get("minc", 1)),
    ]


def release_argv(now, worker, lease, concs):
    """Give *lease* back in each scope: lease sets are KEYS 3, 5, ... (1-based)."""
    argv = ["release", fmt(now), worker, fmt(5.0), str(len(concs))]
    for i, conc in enumerate(concs):
        argv += [lease, str(3 + 2 * i), str(conc)]
    return argv


def quota_argv(now, worker, consumed, remaining, quota, window):
    return [
        *one_scope_head("quota", now, worker),
        fmt(consumed),
        fmt(remaining),
        fmt(quota),
        fmt(window),
    ]


@pytest.fixture
def client(redis_server):  # noqa: F811
    import redis

    r = redis.Redis.from_url(redis_server.url, decode_responses=True)
    yield r
    r.close()


def random_ops(seed: int, count: int = 300):
    """A reproducible mix of every operation; most calls without the heartbeat.

    A worker sends its ttl (the heartbeat) on some calls only: between them,
    workers whose end passed are still in the set, and every liveness check
    must see them as gone all the same.
    """
    light = random.Random(seed + 1000)
    for k, argv in _random_ops(seed, count):
        if argv[0] not in ("beat", "leave") and light.random() < 0.6:
            argv = [*argv[:3], "", *argv[4:]]
        yield k, argv


def _random_ops(seed: int, count: int):
    """A reproducible mix of every operation over five scopes and four workers."""
    rng = random.Random(seed)
    now = 1_700_000_000.0 + rng.random()
    leases: list[tuple[str, list[str], list[int]]] = []
    configs = {
        "a": {"delay": 0.5, "concurrency": 2},
        "b": {"delay": 0.0, "concurrency": 1, "quota": 3.0, "window": 4.0},
        "c": {"delay": 0.25, "concurrency": 3, "cd": 0.0},
        "r": {"delay": 0.8, "concurrency": 3, "rampup": True, "minc": 1, "jf": 1.1},
        "z": {"delay": 0.3, "concurrency": 2, "rampup": True, "rmin": 0.0, "rwin": 1.0},
    }
    for i in range(count):
        now += rng.choice([0.0, 0.001, 0.1, 0.3, 0.7, 1.3, 4.0])
        # Ids that differ only at the front or only at the end, one not ASCII:
        # the rank compares bytes from the end, in the script as in the twin.
        worker = rng.choice(["w0", "w1", "x:12:a1", "h\u00e9:2:a1"])
        op = rng.random()
        if op < 0.55:
            chosen = rng.sample(sorted(configs), rng.randint(1, 4))
            specs = []
            for name in chosen:
                spec = dict(configs[name])
                if name == "c" and rng.random() < 0.2:
                    spec["cd"] = rng.choice([0.0, 0.75, 1.5])
                spec["amount"] = rng.choice([1.0, 1.0, 2.5])
                specs.append(spec)
            lease = f"{worker}:{i}"
            argv = acquire_argv(now, worker, lease, specs, horizon=rng.choice([0.5, 30.0]))
            k = keys(*chosen)
            if leases and rng.random() < 0.4:
                # A finished request's lease rides on this acquire.
                old, old_scopes, old_concs = leases.pop(rng.randrange(len(leases)))
                k, argv = with_releases(k, argv, old, old_scopes, old_concs)
            leases.append((lease, chosen, [s["concurrency"] for s in specs]))
            yield k, argv
        elif op < 0.8 and leases:
            lease, chosen, concs = leases.pop(rng.randrange(len(leases)))
            yield keys(*chosen), release_argv(now, worker, lease, concs)
        elif op < 0.93:
            scope = rng.choice(sorted(configs))
            hold = rng.choice([-1.0, -1.0, -1.0, 0.0, 2.0, 3.0] if scope != "r" else [-1.0, 5.0])
            age = rng.choice([0.0, 0.5, 3.0])
            yield keys(scope), backoff_argv(now, worker, hold, age, scope=configs[scope])
        elif op < 0.97:
            yield (
                keys("b"),
                quota_argv(
                    # -5: a refund beyond what is counted stops at zero, in both.
                    now,
                    worker,
                    rng.choice([0.0, 1.0, -5.0]),
                    rng.choice([-1.0, 0.0, 2.0]),
                    3.0,
                    4.0,
                ),
            )
        elif op < 0.985:
            # A fallback's requests in flight and its pace, told after an outage.
            chosen = rng.sample(sorted(configs), rng.randint(1, 2))
            argv = ["adopt", fmt(now), worker, fmt(5.0), "0", fmt(10.0), fmt(600.0)]
            argv.append(str(len(chosen)))
            lease = f"{worker}:{i}"
            for name in chosen:
                units = rng.choice([0.0, 0.0, 1.0, 2.5])
                window = configs[name].get("window", 10.0)
                argv += [fmt(rng.choice([0.0, 0.4, 2.0])), fmt(units), fmt(window), "1", lease]
            leases.append((lease, chosen, [configs[name]["concurrency"] for name in chosen]))
            yield keys(*chosen), argv
        else:
            last = rng.random()
            if last < 0.35:
                yield [WORKERS], ["beat", fmt(now), worker, fmt(5.0), "0"]
            elif last < 0.6:
                # Back from a fallback: when does every worker go back to the store?
                yield [WORKERS, NS + "r"], ["beat", fmt(now), worker, fmt(5.0), "0", fmt(600.0)]
            elif last < 0.85:
                # Named for a free slot it no longer waits for: the next queued worker.
                scope = rng.choice(sorted(configs))
                yield keys(scope), ["release", fmt(now), worker, fmt(5.0), "0", "1", "2"]
            else:
                yield [WORKERS], ["leave", fmt(now), worker, fmt(5.0), "0"]


def stored_hashes(client) -> dict[str, dict[str, str]]:
    return {key: client.hgetall(key) for key in client.keys(NS + "*") if client.type(key) == "hash"}


@pytest.mark.parametrize("seed", range(6))
def test_script_and_twin_agree(client, seed):
    """Random sequences of every operation give byte-identical replies from Lua and the twin."""
    script = client.register_script(script_source())
    twin = TwinStore(Clock())  # its clock stays at 0, so no key expires in the twin
    twin_messages: list[str] = []
    twin.subscribers.append(lambda channel, message: twin_messages.append(message))
    events = client.pubsub(ignore_subscribe_messages=True)
    events.subscribe(NS + "ev")
    events.get_message(timeout=1.0)
    for step, (k, argv) in enumerate(random_ops(seed)):
        expected = twin.run(k, argv)
        got = script(keys=k, args=argv)
        assert got == expected, f"step {step}: {argv}"
        # The same messages, in the same order (which worker a freed slot wakes).
        published = []
        while len(published) < len(twin_messages):
            message = events.get_message(timeout=1.0)
            assert message is not None, f"step {step}: missing {twin_messages}"
            published.append(message["data"])
        assert published == twin_messages, f"step {step}: {argv}"
        assert events.get_message(timeout=0.0) is None, f"step {step}: extra message"
        twin_messages.clear()
        # The same state stored: a save writes only the fields that changed.
        assert stored_hashes(client) == {k: v for k, v in twin.hashes.items() if v}, step
    events.close()
    # Every key the script wrote expires.
    for key in client.keys("{t}:*"):
        assert client.pttl(key) > 0, key


def test_script_uses_redis_time_when_not_pinned(client):
    """Without a pinned time the script reads TIME: the reply is a relative wait."""
    script = client.register_script(script_source())
    spec = [{"delay": 2.0, "concurrency": 5}]
    unpinned = [acquire_argv(0, "w", lease, spec) for lease in ("l1", "l2")]
    for argv in unpinned:
        argv[1] = ""  # no pinned time: the script reads TIME
    first = script(keys=keys("x"), args=unpinned[0])
    second = script(keys=keys("x"), args=unpinned[1])
    assert first[0] == second[0] == "ok"
    assert float(first[2]) == 0.0
    assert 1.9 < float(second[2]) <= 2.0


def test_all_keys_share_one_hash_tag(client):
    """Every key the script touches carries the namespace's hash tag (Redis Cluster safe)."""
    script = client.register_script(script_source())
    script(keys=keys("a", "b"), args=acquire_argv(100.0, "w", "l", [{}, {}]))
    script(keys=keys("a"), args=backoff_argv(100.0, "w", 3.0, 0.0))
    assert client.keys("*")
    assert all(key.startswith("{t}:") for key in client.keys("*"))
    from redis.crc import key_slot

    assert len({key_slot(key.encode()) for key in client.keys("*")}) == 1


def store_runner(client, store):
    """``run(keys, argv)`` on the real script or on its twin."""
    if store == "twin":
        return TwinStore(Clock()).run
    script = client.register_script(script_source())
    return lambda k, argv: script(keys=k, args=argv)


@pytest.mark.parametrize("store", ["script", "twin"])
def test_rampup_triggers_within_target_hold_the_rate(client, store):
    """As in one process: up to the target's high end per window the rate holds, then steps.

    A trigger after a window ended counts in the new window, not the old one.
    """
    run = store_runner(client, store)
    r = {"delay": 0.8, "concurrency": 3, "rampup": True, "minc": 1, "rhigh": 2, "rwin": 6.0}
    now = 1_700_000_000.0
    assert run(keys("r"), acquire_argv(now, "w", "l1", [r]))[0] == "ok"
    outcomes = []
    for i in range(3):
        reply = run(keys("r"), backoff_argv(now + 0.1 * (i + 1), "w", -1.0, 0.0, scope=r))
        outcomes.append((reply[2], float(reply[3])))
    assert outcomes[0] == ("ramp", 0.0)
    assert outcomes[1] == ("ramp", 0.0)
    assert outcomes[2][0] == "step"
    assert outcomes[2][1] > 0
    # Next window: the count starts again (the step taken is still in force; its
    # 1.6 s gap still lets a 6 s window hold more triggers than the target).
    reply = run(keys("r"), backoff_argv(now + 6.5, "w", -1.0, 0.0, scope=r))
    assert reply[2] == "ramp"


@pytest.mark.parametrize("store", ["script", "twin"])
def test_shared_rampup_starts_no_faster_than_its_min_delay(client, store):
    """As in one process: a delay below rampup's min_delay starts at the min_delay."""
    run = store_runner(client, store)
    r = {"delay": 0.0, "rmin": 0.5, "concurrency": 3, "minc": 3, "rampup": True, "rwin": 6.0}
    now = 1_700_000_000.0
    assert run(keys("r"), acquire_argv(now, "w", "l1", [r]))[2] == fmt(0.0)
    reply = run(keys("r"), acquire_argv(now + 0.1, "w", "l2", [r]))
    assert reply[2] == fmt(0.4)  # the slot 0.5 s after the first (it was 0)


@pytest.mark.parametrize("store", ["script", "twin"])
def test_hints_beyond_the_rampup_target_step_once_per_hold(client, store):
    """As in one process: a hinted trigger beyond the target holds and steps the rate
    back once; the rest of its burst, answered while the scope is held, only holds."""
    run = store_runner(client, store)
    r = {"delay": 0.8, "concurrency": 3, "rampup": True, "minc": 1, "rhigh": 1, "rwin": 6.0}
    now = 1_700_000_000.0
    assert run(keys("r"), acquire_argv(now, "w", "l1", [r]))[0] == "ok"
    first = run(keys("r"), backoff_argv(now + 0.1, "w", 1.0, 0.0, scope=r))
    assert (first[2], float(first[3])) == ("held", 0.0)  # within the target: no step
    beyond = run(keys("r"), backoff_argv(now + 1.2, "w", 1.0, 0.0, scope=r))
    assert beyond[2] == "held"
    stepped = float(beyond[3])
    assert stepped > 0
    burst = run(keys("r"), backoff_argv(now + 1.3, "w", 1.0, 0.0, scope=r))
    assert (burst[2], float(burst[3])) == ("held", stepped)
    # After the hold, an answer to a request sent before it began: no step.
    late = run(keys("r"), backoff_argv(now + 2.5, "w", 1.0, 1.5, scope=r))
    assert (late[2], float(late[3])) == ("held", stepped)


@pytest.mark.parametrize("store", ["script", "twin"])
def test_a_lowered_ceiling_holds_for_a_shared_rampup_at_once(client, store):
    """As in one process: rampup's shared concurrency above a ceiling lowered since
    (robots.txt's 1, a slot's concurrency) comes down to it at once."""
    run = store_runner(client, store)
    r = {"delay": 0.0, "rmin": 0.0, "concurrency": 3, "rampup": True, "minc": 1, "rwin": 3.0}
    now = 1_700_000_000.0
    for i, lease in enumerate(("l1", "l2", "l3")):  # two quiet windows: concurrency 3
        argv = acquire_argv(now + 3.1 * i, "w", lease, [r], lease_ttl=1.0)
        assert run(keys("r"), argv)[0] == "ok"
    # One lease (l3) still held: a second goes at 3, not at 1.
    assert run(keys("r"), acquire_argv(now + 6.3, "w", "l4", [r], lease_ttl=1.0))[0] == "ok"
    lowered = {**r, "concurrency": 1}
    assert run(keys("r"), acquire_argv(now + 6.4, "w", "l5", [lowered]))[0] == "full"


@pytest.mark.parametrize("store", ["script", "twin"])
def test_a_step_beyond_the_target_first_takes_back_raised_concurrency(client, store):
    """As in one process: a step lowers rampup's shared concurrency before the delay grows."""
    run = store_runner(client, store)
    r = {
        "delay": 0.0,
        "rmin": 0.0,
        "concurrency": 3,
        "rampup": True,
        "minc": 1,
        "rhigh": 1,
        "rwin": 3.0,
    }
    now = 1_700_000_000.0
    for i, lease in enumerate(("l1", "l2", "l3")):  # two quiet windows: concurrency 3
        assert run(keys("r"), acquire_argv(now + 3.1 * i, "w", lease, [r]))[0] == "ok"
    outcomes = []
    for i in range(4):
        reply = run(keys("r"), backoff_argv(now + 6.3 + 0.1 * i, "w", -1.0, 0.0, scope=r))
        outcomes.append((reply[2], float(reply[3])))
    assert outcomes[:3] == [("ramp", 0.0), ("step", 0.0), ("step", 0.0)]
    assert outcomes[3][0] == "step"
    assert outcomes[3][1] > 0  # at the floor: the delay steps


@pytest.mark.parametrize("store", ["script", "twin"])
def test_a_quota_counts_in_the_window_its_request_goes_in(client, store):
    """A reservation made at the end of one window for a time in the next counts in the
    next: that window then admits only the rest of its quota (aligned windows of 10 s)."""
    run = store_runner(client, store)
    q = {"delay": 4.0, "concurrency": 10, "quota": 2.0, "window": 10.0}
    start = 1_700_000_000.0  # a window boundary
    replies = [
        run(keys("q"), acquire_argv(start + at, "w", f"l{i}", [q]))
        for i, at in enumerate((7.0, 7.1, 10.5, 10.6))
    ]
    # Reserved for 7.0, 11.0 (next window), 15.0; the fourth would be 19.0: a
    # third arrival in the window [10, 20), so it waits for the one after.
    assert [r[0] for r in replies] == ["ok", "ok", "ok", "wait"]
    assert float(replies[1][2]) == pytest.approx(3.9)
    assert float(replies[3][2]) == pytest.approx(20.0 - 10.6)


@pytest.mark.parametrize("store", ["script", "twin"])
def test_a_slot_freed_for_a_named_worker_is_held_for_it(client, store):
    """The worker that releases a slot asks again a round trip before the worker the
    release named (probe: one worker took every slot of a scope of 1, 40 to 0). The named
    worker's claim holds the slot against other asks for a moment, then lapses."""
    run = store_runner(client, store)
    c = {"delay": 0.0, "concurrency": 1}
    t = 1_700_000_000.0
    assert run(keys("c"), acquire_argv(t, "h", "h1", [c]))[0] == "ok"
    assert run(keys("c"), acquire_argv(t + 0.01, "w", "w1", [c]))[0] == "full"  # w queues
    run(keys("c"), release_argv(t + 0.02, "h", "h1", [1]))  # names w
    assert run(keys("c"), acquire_argv(t + 0.03, "h", "h2", [c]))[0] == "full"
    assert run(keys("c"), acquire_argv(t + 0.04, "w", "w2", [c]))[0] == "ok"
    run(keys("c"), release_argv(t + 0.05, "w", "w2", [1]))  # names h, which stays silent
    assert run(keys("c"), acquire_argv(t + 0.06, "w", "w3", [c]))[0] == "full"
    # The claim lapses after half a second: the slot is anyone's again.
    assert run(keys("c"), acquire_argv(t + 0.6, "w", "w4", [c]))[0] == "ok"


@pytest.mark.parametrize("store", ["script", "twin"])
def test_backoff_recovery_brings_the_next_slot_back_in(client, store):
    """A probe saw the backed-off pace last 2-3 times BACKOFF_WINDOW: reservations made
    at the stepped interval kept the next slot far out after the backoff recovered."""
    run = store_runner(client, store)
    s = {"delay": 0.1, "concurrency": 10, "bwin": 1.0}
    t = 1_700_000_000.0
    assert run(keys("s"), acquire_argv(t, "w", "l1", [s]))[0] == "ok"
    run(keys("s"), backoff_argv(t + 0.01, "w", -1.0, 0.0, delay=0.1, bwin=1.0))  # 0.1 -> 1 s
    # The new interval from the step (t + 0.01), as in one process.
    assert float(run(keys("s"), acquire_argv(t + 0.02, "w", "l2", [s]))[2]) == pytest.approx(0.99)
    # The next backed-off slot (t + 2.01) is past the step down at t + 1.01: not
    # reserved at that pace; the worker asks again once the backoff stepped down.
    reply = run(keys("s"), acquire_argv(t + 0.03, "w", "l3", [s]))
    assert reply[0] == "wait"
    assert float(reply[2]) == pytest.approx(0.98)
    # Then: 0.1 s after the last reserved slot (t + 1.01), not the backed-off 1 s.
    reply = run(keys("s"), acquire_argv(t + 1.02, "w", "l4", [s]))
    assert reply[0] == "ok"
    assert float(reply[2]) == pytest.approx(1.11 - 1.02)


def _four_reserved(run, s, t):
    """w0 goes at t; w1..w3 reserve t + 0.5, t + 1.0, t + 1.5 (delay 0.5)."""
    waits = [float(run(keys("s"), acquire_argv(t, f"w{i}", f"l{i}", [s]))[2]) for i in range(4)]
    assert waits == pytest.approx([0.0, 0.5, 1.0, 1.5])


@pytest.mark.parametrize("store", ["script", "twin"])
def test_a_hold_brings_the_next_slot_to_its_end(client, store):
    """The workers give back their reservations on a hold: the slots they held are not
    kept, so the next request goes when the hold ends (a review: 1 s later per three)."""
    run = store_runner(client, store)
    s = {"delay": 0.5, "concurrency": 10}
    t = 1_700_000_000.0
    _four_reserved(run, s, t)
    run(keys("s"), backoff_argv(t + 0.1, "w0", 1.0, 0.0, delay=0.5))  # Retry-After: 1
    assert float(run(keys("s"), acquire_argv(t + 0.2, "w1", "l1b", [s]))[2]) == pytest.approx(0.9)


@pytest.mark.parametrize("store", ["script", "twin"])
def test_a_step_puts_the_next_slot_one_new_interval_from_now_at_most(client, store):
    """After a step the workers ask again; the next slot is the new interval (1 s) from
    the step, not after the three given back (t + 2.5, as a review measured)."""
    run = store_runner(client, store)
    s = {"delay": 0.5, "concurrency": 10}
    t = 1_700_000_000.0
    _four_reserved(run, s, t)
    run(keys("s"), backoff_argv(t + 0.1, "w0", -1.0, 0.0, delay=0.5))  # a 503: 0.5 -> 1 s
    assert float(run(keys("s"), acquire_argv(t + 0.2, "w1", "l1b", [s]))[2]) == pytest.approx(0.9)


def test_a_claim_never_leaves_a_key_without_expiry():
    """A scope's state can expire while a lease lives (key_ttl < lease_ttl); a waiter's
    queue entry then makes the hash anew, and naming it must not leave it for ever."""
    from twisted.internet.task import Clock

    clock = Clock()
    clock.advance(1_700_000_000.0)
    store = TwinStore(clock)
    c = {"delay": 0.0, "concurrency": 1, "window": 0.001}
    argv = acquire_argv(clock.seconds(), "h", "h1", [c])
    argv[8] = fmt(0.001)  # key ttl: the state hash expires at once, the lease (10 s) lives
    assert store.run(keys("c"), argv)[0] == "ok"
    clock.advance(0.01)
    assert store.run(keys("c"), acquire_argv(clock.seconds(), "w", "w1", [c]))[0] == "full"
    store.run(keys("c"), release_argv(clock.seconds(), "h", "h1", [1]))  # names w
    assert store.hashes[NS + "s:c"].get("nm")
    assert store.ttl(NS + "s:c") is not None


def _an_eight_second_gap(client, store, bwin=5.0):
    """A scope (delay 1 s, BACKOFF_WINDOW *bwin*) stepped to an 8 s gap ending at t + 8.03."""
    run = store_runner(client, store)
    s = {"delay": 1.0, "concurrency": 10, "bwin": bwin}
    t = 1_700_000_000.0
    assert run(keys("s"), acquire_argv(t, "w", "l1", [s]))[0] == "ok"
    for step in (1, 2, 3):  # 1 s -> 2, 4, 8 s
        run(keys("s"), backoff_argv(t + 0.01 * step, "w", -1.0, 0.0, bwin=bwin))
    return run, s, t


@pytest.mark.parametrize("store", ["script", "twin"])
def test_a_gap_longer_than_the_window_is_not_a_quiet_window(client, store):
    """As in one process: an 8 s backoff gap with a 5 s BACKOFF_WINDOW ran only 5 s,
    the step down coming before the scope could send again (so max_delay above the
    window was never reached). The countdown starts when the gap ends."""
    run, s, t = _an_eight_second_gap(client, store)
    reply = run(keys("s"), acquire_argv(t + 6.0, "w", "l2", [s]))
    assert reply[0] == "ok"  # reserved: for the end of the 8 s gap, not now
    assert float(reply[2]) == pytest.approx(8.03 - 6.0)


@pytest.mark.parametrize("store", ["script", "twin"])
def test_a_short_hold_does_not_cut_a_longer_backoff_gap(client, store):
    """A review: a 0.5 s Retry-After during an 8 s backoff gap let the next request
    go after 0.6 s in shared mode (the hold gave back every reservation, the gap's
    included); in one process the gap runs whole."""
    run, s, t = _an_eight_second_gap(client, store)
    run(keys("s"), backoff_argv(t + 0.1, "w", 0.5, 0.0, bwin=5.0))
    reply = run(keys("s"), acquire_argv(t + 6.0, "w", "l2", [s]))
    assert reply[0] == "ok"
    assert float(reply[2]) == pytest.approx(8.03 - 6.0)


@pytest.mark.parametrize("store", ["script", "twin"])
def test_a_trigger_is_within_rampup_target_only_while_a_window_holds_more(client, store):
    """As in one process: with a gap of a window or more, every window held one
    trigger, within a target of 1, so a dead site's gap stopped growing."""
    run = store_runner(client, store)
    r = {"delay": 1.0, "concurrency": 1, "rampup": True, "rhigh": 1, "rwin": 2.0, "rmin": 0.0}
    t = 1_700_000_000.0
    assert run(keys("r"), acquire_argv(t, "w", "l1", [r]))[0] == "ok"
    # The delay (1 s) times the target + 1 (2) is not below the 2 s window: a step.
    assert run(keys("r"), backoff_argv(t + 0.1, "w", -1.0, 0.0, bwin=2.0, scope=r))[2:4] == [
        "step",
        fmt(2.0),
    ]


@pytest.mark.parametrize("store", ["script", "twin"])
def test_a_second_short_hold_gives_back_reservations_past_the_gap(client, store):
    """A review: the cap on a hold counted the gap from the last hold, not from the
    last slot taken, so a second short hold kept w2's reservation twice as far out
    (6.6 s instead of 1.63 s)."""
    run, s, t = _an_eight_second_gap(client, store)
    run(keys("s"), backoff_argv(t + 5.0, "w", 0.5, 0.0, bwin=5.0))
    assert run(keys("s"), acquire_argv(t + 5.2, "w2", "l2", [s]))[0] == "ok"  # t + 8.03
    run(keys("s"), backoff_argv(t + 6.0, "w", 0.3, 0.0, bwin=5.0))
    run(keys("s"), release_argv(t + 6.0, "w2", "l2", [10]))  # given back on "hold"
    reply = run(keys("s"), acquire_argv(t + 6.4, "w2", "l3", [s]))
    assert float(reply[2]) == pytest.approx(8.03 - 6.4)


@pytest.mark.parametrize("store", ["script", "twin"])
def test_a_short_hold_after_a_gap_was_used_keeps_the_next_gap(client, store):
    """A review: a short hold after the first request of an 8 s gap went let the
    next reserved request go 0.57 s after it; in one process it waits the gap."""
    run, s, t = _an_eight_second_gap(client, store, bwin=20.0)
    run(keys("s"), acquire_argv(t + 0.5, "w2", "l2", [s]))  # reserved t + 8.03
    run(keys("s"), acquire_argv(t + 1.0, "w3", "l3", [s]))  # reserved t + 16.03
    # w2's request, sent at t + 8.03, is answered 429 with Retry-After: 0.5.
    run(keys("s"), backoff_argv(t + 8.1, "w2", 0.5, 0.07, bwin=20.0))
    run(keys("s"), release_argv(t + 8.1, "w3", "l3", [10]))  # given back on "hold"
    reply = run(keys("s"), acquire_argv(t + 8.1, "w3", "l4", [s]))
    assert float(reply[2]) == pytest.approx(16.03 - 8.1)
