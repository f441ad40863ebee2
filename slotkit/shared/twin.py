"""The pure-Python twin of ``script.lua``.

:class:`TwinStore` runs the script's operations on the few Redis structures
it touches (hashes, sorted sets, expiries, a publish channel; kept in dicts
by :class:`~slotkit.shared.twin_keys.TwinKeys`) with the same arithmetic:
numbers go through the same ``'%.6f'`` text on their way into storage, so
the twin and the script give byte-identical replies for the same inputs
(``tests/test_shared_script.py`` checks that on random sequences against a
real ``redis-server``).

It serves two purposes: the unit tests, on a
:class:`twisted.internet.task.Clock`, and the ``local`` mode, where several
crawlers of one process share throttling without a server.

The code follows the script's structure step by step on purpose; read the
two side by side when changing either.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from slotkit.rampup import window_holds_more
from slotkit.scope_feedback import quiet_window_end
from slotkit.shared.twin_curve import gap_end, ramp, settle, step
from slotkit.shared.twin_keys import (
    CLAIM,
    FIELDS,
    ScopeState,
    TwinKeys,
    as_number,
    fmt,
    ms,
    ms_after,
)

if TYPE_CHECKING:
    from twisted.internet.interfaces import IReactorTime

__all__ = ["TwinStore", "fmt"]

#: The six rampup arguments ``acquire`` and ``backoff`` both take for a scope.
RAMPUP_ARGS = ("ron", "rlow", "rfac", "rmin", "rwin", "minc")
#: The backoff curve of a scope, as both operations pass it.
CURVE_ARGS = ("factor", "bmin", "bmax", "bwin")
#: The arguments of one scope in an ``acquire``, in order.
SCOPE_ARGS = ("amount", "delay", "conc", "quota", "window", "cd", *CURVE_ARGS, "jf", *RAMPUP_ARGS)
#: One scope's arguments of ``backoff``, in order.
BACKOFF_ARGS = ("hold", "age", "delay", "cd", *CURVE_ARGS, *RAMPUP_ARGS, "conc", "rhigh")


class TwinStore(TwinKeys):
    """An in-memory stand-in for the Redis server, running the script's operations."""

    def __init__(self, clock: IReactorTime) -> None:
        super().__init__(clock)
        #: How many script runs the store has served (what "Redis calls" counts).
        self.calls = 0

    # The script

    def run(self, keys: Sequence[str], argv: Sequence[str]) -> list[str]:
        """Run one operation, exactly as ``script.lua`` would; return its reply."""
        try:
            return self._run(keys, argv)
        finally:
            self._deliver()

    def _run(self, keys: Sequence[str], argv: Sequence[str]) -> list[str]:
        self.calls += 1
        op = argv[0]
        now = float(argv[1]) if argv[1] != "" else float(self._clock.seconds())
        wid = argv[2]
        wttl = float(argv[3]) if argv[3] != "" else None  # '': no heartbeat
        workers = keys[0]
        prefix = workers[:-1]
        channel = prefix + "ev"

        def scope_of(key: str) -> str:
            return key[len(prefix) + 2 :]

        def load(key: str) -> ScopeState:
            self._live(key)
            raw = self.hashes.get(key, {})
            state = ScopeState()
            state.was = {name: as_number(raw.get(name)) for name in FIELDS}
            for name, value in state.was.items():
                setattr(state, name, value)
            return state

        def save(key: str, state: ScopeState, ttl: float) -> None:
            self._live(key)
            changed = {
                name: fmt(getattr(state, name))
                for name in FIELDS
                if getattr(state, name) != state.was[name]
            }
            if changed:
                self.hashes.setdefault(key, {}).update(changed)
            keep = ttl
            horizon = max(state.tat, state.hold, state.rec) - now
            if horizon + ttl > keep:
                keep = horizon + ttl
            self._pexpire(key, keep)

        # 1. Heartbeat, on the calls carrying the worker ttl (see the script).
        count = ""
        if wttl is not None:
            self._zremrange(workers, ms(now))
            if op == "leave":
                self._zset(workers).pop(wid, None)
            else:
                self._zadd(workers, ms_after(now + wttl), wid)
            self._pexpire(workers, wttl * 2)
            live = self._zset(workers)
            n = max(1, len(live))
            # Ids compared by their bytes from the end (see the script).
            mine = wid.encode()[::-1]
            count = f"{n}:{sum(1 for other in live if other.encode()[::-1] < mine)}"

        # 2. Leases given back, riding on this call.
        nrel = int(argv[4])
        for r in range(nrel):
            b = 4 + 3 * r
            index = int(argv[b + 2])
            lkey = keys[index - 1]
            leases = self._zset(lkey)
            active = len(leases)
            removed = leases.pop(argv[b + 1], None) is not None
            if not leases:
                self.zsets.pop(lkey, None)
            if removed:
                skey = keys[index - 2]
                message = "free\t" + scope_of(lkey)
                who = self._first_waiter(skey, workers, None, now)
                if who is not None:
                    self._name(skey, who, workers, now, message)
                else:
                    limit = float(argv[b + 3])
                    self._live(skey)
                    rc = as_number(self.hashes.get(skey, {}).get("rc"))
                    if 1 <= rc < limit:
                        limit = rc
                    if active >= limit:
                        self.publish(channel, message)
        o = 4 + 3 * nrel  # where the op's own arguments start (0-based, minus one)

        if op == "beat" and len(argv) > o + 1:
            grace, resync_key = float(argv[o + 1]), keys[1]
            self._live(resync_key)
            stored = self.hashes.get(resync_key, {}).get("at")
            if stored is None:
                stored = fmt(now + grace)
                self.hashes[resync_key] = {"at": stored}
                self._pexpire(resync_key, 3 * grace)
            return ["ok", count, fmt(float(stored) - now), stored]

        if op == "release" and len(argv) > o + 1:
            for j in range(int(argv[o + 1])):
                skey = keys[int(argv[o + 2 + j]) - 1]
                self._drop_claims(skey, wid, workers, now)
                who = self._first_waiter(skey, workers, wid, now)
                if who is not None:
                    self._name(skey, who, workers, now, "free\t" + scope_of(skey))

        if op in ("beat", "leave", "release"):
            return ["ok", count]

        if op == "acquire":
            return self._acquire(keys, argv, o, now, wid, count, channel, scope_of, load, save)
        if op == "backoff":
            key_ttl = float(argv[o + 1])
            scopes = int(argv[o + 2])
            reply = ["ok", count]
            for i in range(scopes):
                b = o + 2 + i * len(BACKOFF_ARGS)
                a = {name: float(argv[b + 1 + k]) for k, name in enumerate(BACKOFF_ARGS)}
                hold, age, delay, cd = a["hold"], a["age"], a["delay"], a["cd"]
                factor, bmin, bwin = a["factor"], a["bmin"], a["bwin"]
                skey = keys[1 + 2 * i]
                st = load(skey)
                if a["ron"] > 0:
                    ramp(st, a, now)  # the trigger counts in its own window
                    delay = a["delay"]
                if cd > st.cd:
                    st.cd = cd
                base = max(delay, st.cd)
                settle(st, base, factor, bmin, bwin, now)
                outcome = "held"
                if hold >= 0:
                    # By an earlier hint, or sent before the current step or hold.
                    burst = st.hold > now or now - age < st.ss
                    if now + hold > st.hold:
                        st.hold = now + hold
                    # Reservations given back, not the running backoff gap (see the script).
                    cap = st.hold
                    if st.bo > 0:
                        cap = max(cap, gap_end(st, base, now))
                    st.tat = min(st.tat, cap)
                    st.ss = now
                    self.publish(channel, f"hold\t{scope_of(skey)}\t{fmt(st.hold - now)}")
                    # Beyond rampup's target a hint steps too, once per burst (see the script).
                    beyond = not burst and a["ron"] > 0 and st.rt + 1 > a["rhigh"]
                    if beyond and step(st, a, base, now):
                        self.publish(channel, "step\t" + scope_of(skey))
                elif now - age < st.ss:
                    outcome = "dup"
                elif (
                    a["ron"] > 0
                    and st.rt + 1 <= a["rhigh"]
                    and window_holds_more(max(base, st.bo), a["rhigh"], a["rwin"])
                ):
                    outcome = "ramp"  # within the rampup target: the rate holds
                else:
                    if step(st, a, base, now):
                        self.publish(channel, "step\t" + scope_of(skey))
                    st.ss = now
                    outcome = "step"
                if outcome != "dup":
                    st.rt = st.rt + 1
                    if st.bo > 0:
                        # A window the scope may not send in is not quiet (see the script).
                        ready = max(st.hold, gap_end(st, base, now))
                        if outcome == "step":
                            ready = max(ready, now + max(base, st.bo))
                        st.rec = quiet_window_end(now, ready, bwin) if bwin > 0 else 0.0
                save(skey, st, key_ttl)
                reply += [outcome, fmt(st.bo)]
            return reply

        if op == "quota":
            key_ttl = float(argv[o + 1])
            scopes = int(argv[o + 2])
            for i in range(scopes):
                b = o + 2 + i * 4
                consumed, remaining, quota, window = (float(argv[b + 1 + k]) for k in range(4))
                skey = keys[1 + 2 * i]
                st = load(skey)
                widx = math.floor(now / window)
                if widx > st.qw:
                    st.qw = widx
                    st.qu = 0.0
                if widx == st.qw:  # (reservations may count a later window)
                    if remaining >= 0:
                        st.qu = max(0.0, quota - remaining)
                    else:  # a refund gives back at most what is counted
                        st.qu = max(0.0, st.qu + consumed)
                save(skey, st, max(key_ttl, window))
            return ["ok", count]

        if op == "adopt":
            lease_ttl, key_ttl = float(argv[o + 1]), float(argv[o + 2])
            b = o + 3
            for i in range(int(argv[o + 3])):
                gap, units, window = (float(argv[b + k]) for k in (1, 2, 3))
                m = int(argv[b + 4])
                skey, lkey = keys[1 + 2 * i], keys[2 + 2 * i]
                st = load(skey)
                if now + gap > st.tat:
                    st.tat = now + gap
                if units > 0 and window > 0:
                    widx = math.floor(now / window)
                    if widx > st.qw:
                        st.qw = widx
                        st.qu = 0.0
                    if widx == st.qw:
                        st.qu = st.qu + units
                save(skey, st, key_ttl)
                for j in range(m):
                    self._zadd(lkey, ms_after(now + lease_ttl), argv[b + 5 + j])
                left = self.ttl(lkey)
                if m > 0 and (left is None or left * 1000 < math.ceil((lease_ttl + 1) * 1000)):
                    self._pexpire(lkey, lease_ttl + 1)
                b += 4 + m
            return ["ok", count]

        raise ValueError(f"slotkit: unknown operation {op!r}")

    def _acquire(
        self,
        keys: Sequence[str],
        argv: Sequence[str],
        o: int,
        now: float,
        wid: str,
        count: str,
        channel: str,
        scope_of: Callable[[str], str],
        load: Callable[[str], ScopeState],
        save: Callable[[str, ScopeState, float], None],
    ) -> list[str]:
        lease = argv[o + 1]
        lease_ttl = float(argv[o + 2])
        horizon = float(argv[o + 3])
        key_ttl = float(argv[o + 4])
        scopes = int(argv[o + 5])
        states: list[ScopeState] = []
        params: list[dict[str, float]] = []
        # Each scope's claims, read once for the count and the drop (see the script).
        read: list[tuple[list[tuple[str, str]], bool]] = []
        ready = now
        full, full_retry = False, math.inf
        quota_wait = 0.0
        for i in range(scopes):
            b = o + 5 + i * len(SCOPE_ARGS)
            a = {name: float(argv[b + 1 + k]) for k, name in enumerate(SCOPE_ARGS)}
            skey, lkey = keys[1 + 2 * i], keys[2 + 2 * i]
            st = load(skey)
            if a["ron"] > 0:
                ramp(st, a, now)
            if a["cd"] > st.cd:
                st.cd = a["cd"]
            a["base"] = max(a["delay"] * a["jf"], st.cd)
            settle(st, a["base"], a["factor"], a["bmin"], a["bwin"], now)
            a["interval"] = max(a["base"], st.bo)
            self._zremrange(lkey, ms(now))
            leases = self._zset(lkey)
            # Slots claimed for other workers woken for them count as taken.
            read.append(self._read_claims(skey, keys[0], now))
            claims = sum(1 for who, _ in read[-1][0] if who != wid)
            a["active"] = len(leases) + claims
            if a["active"] >= a["conc"]:
                full = True
                retry = CLAIM
                if leases:
                    retry = min(leases.values()) / 1000 - now
                    if claims > 0 and retry > CLAIM:
                        retry = CLAIM
                full_retry = min(full_retry, retry)
                self.publish(channel, "need\t" + scope_of(lkey))
            ready = max(ready, st.tat, st.hold)
            states.append(st)
            params.append(a)
        # A quota counts in the window of the reserved time (see the script).
        for st, a in zip(states, params, strict=True):
            if a["quota"] > 0:
                widx = math.floor(ready / a["window"])
                if widx > st.qw:
                    st.qw = widx
                    st.qu = 0.0
                if st.qu > 0 and st.qu + a["amount"] - a["quota"] > 1e-9:
                    quota_wait = max(quota_wait, (st.qw + 1) * a["window"] - now)
        # No slot beyond a scope's next backoff step down (see the script).
        recovery_wait = 0.0
        for st in states:
            if st.bo > 0 and st.rec - now > 0.000001 and ready > st.rec:
                recovery_wait = max(recovery_wait, st.rec - now)
        wait = ready - now
        status = "ok"
        if full:
            status = "full"
            wait = max(wait, full_retry)
        elif quota_wait > 0:
            status = "wait"
            wait = max(wait, quota_wait)
        elif recovery_wait > 0:
            status = "wait"
            wait = recovery_wait
        elif wait > horizon:
            status = "wait"
        taken = 0
        if status == "ok":
            taken = 1
            for i, (st, a) in enumerate(zip(states, params, strict=True)):
                st.tat = ready + a["interval"]
                if a["quota"] > 0:
                    st.qu = st.qu + a["amount"]
                if a["ron"] > 0:
                    if st.rwe <= 0:
                        st.rwe = now + a["rwin"]
                    st.rs = st.rs + 1
                lkey = keys[2 + 2 * i]
                self._zadd(lkey, ms_after(ready + lease_ttl), lease)
                self._pexpire(lkey, ready + lease_ttl - now + 1)
                save(keys[1 + 2 * i], st, max(key_ttl, a["window"]))
        for i, a in enumerate(params):
            skey = keys[1 + 2 * i]
            self._drop_claims(skey, wid, keys[0], now, read[i])
            if status != "full":
                self._leave_queue(skey, wid)
            if a["active"] >= a["conc"]:
                if status == "full":
                    self._enqueue(skey, wid, key_ttl)
            elif status != "ok":
                who = self._first_waiter(skey, keys[0], wid, now)
                if who is not None:
                    self._name(skey, who, keys[0], now, "free\t" + scope_of(skey))
        reply = [status, count, fmt(wait)]
        for st, a in zip(states, params, strict=True):
            reply += [fmt(max(0.0, st.hold - now)), str(int(a["conc"] - a["active"] - taken))]
        return reply
