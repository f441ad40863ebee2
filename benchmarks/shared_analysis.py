"""What the shared-throttling benchmark reports, from the arrivals and the workers' results."""

from __future__ import annotations

from typing import Any

__all__ = ["analyse", "pct"]


def pct(values: list[float], q: float) -> float | None:
    """The *q* quantile of sorted *values*, in milliseconds."""
    if not values:
        return None
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 3)


def analyse(
    n, scenario, args, recorder, workers, hosts, requests, outage, store, machine
) -> dict[str, Any]:
    arrivals = recorder.arrivals
    by_worker: dict[str, list[float]] = {}
    for t, _, w, _ in arrivals:
        by_worker.setdefault(w, []).append(t)
    # The window in which every worker was crawling.
    begin = max(min(ts) for ts in by_worker.values()) + 0.5
    end = min(max(ts) for ts in by_worker.values()) - 0.5
    result: dict[str, Any] = {"n": n, "scenario": scenario, "window_s": round(end - begin, 2)}
    # How busy the machine was while every worker crawled (start-ups out).
    result["machine"] = machine.between(begin, end)
    if scenario in ("rate", "baseline", "skew"):
        target = 1.0 / args.delay
        rates = {}
        for host in hosts:
            count = sum(1 for t, h, _, _ in arrivals if h == host and begin <= t < end)
            rates[host] = count / (end - begin)
        result["target_per_host"] = target
        result["rate_per_host"] = {h: round(r, 2) for h, r in rates.items()}
        result["rate_error_pct"] = {h: round((r / target - 1) * 100, 1) for h, r in rates.items()}
        shares = {}
        for w, ts in by_worker.items():
            shares[w] = sum(1 for t in ts if begin <= t < end)
        mean = sum(shares.values()) / len(shares)
        result["share_error_pct"] = round(max(abs(s / mean - 1) for s in shares.values()) * 100, 1)
    if scenario == "conc":
        result["max_in_progress"] = recorder.max_in_progress
        result["violations"] = recorder.violations
        # How well the slots are used: at most concurrency / response time.
        count = sum(1 for t, _, _, _ in arrivals if begin <= t < end)
        result["requests_per_s"] = round(count / (end - begin), 1)
        result["slots_per_s_at_most"] = round(2 / recorder.latency, 1)
    if scenario == "retry" and recorder.retry_sent_at is not None:
        t429 = recorder.retry_sent_at
        host_429, worker_429 = next((h, w) for t, h, w, _ in arrivals if t == t429)
        result["worker_that_got_the_429"] = worker_429
        after = sorted(t for t, h, _, _ in arrivals if h == host_429 and t > t429)
        result["retry_after_429_first_arrival_s"] = round(after[0] - t429, 3) if after else None
        firsts = {}
        for t, h, w, _ in arrivals:
            if h == host_429 and t > t429 and w not in firsts:
                firsts[w] = round(t - t429, 3)
        result["retry_after_first_arrival_per_worker_s"] = firsts
        stored = outage.get("hold_stored")
        if stored is not None:
            result["hold_stored_after_429_s"] = round(stored - t429, 3)
            after_hold = [t for t in after if t > stored]
            result["first_arrival_after_hold_stored_s"] = (
                round(after_hold[0] - stored, 3) if after_hold else None
            )
            result["arrivals_between_429_and_hold_stored"] = len(after) - len(after_hold)
            sent_at = {}
            for w in workers:
                for path, t in (w.get("dispatched") or {}).items():
                    sent_at["/" + path] = t
            early = [
                (round(t - stored, 3), round(sent_at[p] - stored, 3) if p in sent_at else None)
                for t, h, _, p in arrivals
                if h == host_429 and t429 < t < stored + recorder.retry_after - 0.05
            ]
            result["early_arrivals_vs_hold_stored_s_(arrival,dispatch)"] = early
            result["events_per_worker"] = {w.get("worker"): w.get("events") for w in workers}
            result["listener_per_worker"] = {w.get("worker"): w.get("listener") for w in workers}
            result["hold_event_after_stored_s"] = {
                w.get("worker"): None
                if w.get("hold_event_at") is None
                else round(w["hold_event_at"] - stored, 3)
                for w in workers
            }
    if scenario in ("kill", "freeze"):
        down, up = outage["down"], outage["up"]
        result["outage_s"] = round(up - down, 2)
        result["requests_per_worker"] = requests
        result["responses"] = [w.get("responses") for w in workers]
        result["lost"] = sum(requests - (w.get("responses") or 0) for w in workers)
        result["fallback_after_outage_s"] = [
            None if w.get("fell_back_at") is None else round(w["fell_back_at"] - down, 3)
            for w in workers
        ]
        result["resync_after_return_s"] = [
            None if w.get("resynced_at") is None else round(w["resynced_at"] - up, 3)
            for w in workers
        ]
    if scenario != "baseline":
        requests_sent = max(1, len(arrivals))
        for key in ("calls", "commands", "acquires", "reasks", "late"):
            result[f"{key}_per_request"] = round(
                sum(w.get(key, 0) for w in workers) / requests_sent, 3
            )
        for key in ("acquire_p50_ms", "acquire_p99_ms", "go_now_p99_ms", "lag_p99_ms"):
            values = [w[key] for w in workers if w.get(key) is not None]
            result[f"{key}_worst_worker"] = max(values) if values else None
        result.update(_steady(workers, begin, end))
        result.update(_store_steady(store, begin, end))
        result["go_now_acquires"] = sum(w.get("go_now_count", 0) for w in workers)
        result["fallbacks"] = sum(w.get("fallbacks", 0) for w in workers)
    exits = [w["exit_after_close_s"] for w in workers if "exit_after_close_s" in w]
    result["exit_after_close_s_max"] = max(exits) if exits else None
    result["errors"] = [w["error"] for w in workers if "error" in w]
    for w in workers:
        for key in ("dispatched", "rtt_series", "lag_series"):
            w.pop(key, None)
    return result


def _store_steady(store: list[tuple[int, float, str]], begin: float, end: float) -> dict[str, Any]:
    """The server's time per ``acquire`` in the steady window (its log has whole seconds)."""
    if not store:
        return {}
    inside = sorted(took for t, took, fn in store if fn == "acquire" and begin <= t <= end - 1)
    return {
        "store_acquires": len(inside),
        "store_acquire_p50_ms": pct(inside, 0.5),
        "store_acquire_p99_ms": pct(inside, 0.99),
        "store_acquire_max_ms": round(inside[-1] * 1000, 3) if inside else None,
    }


def _steady(workers: list[dict[str, Any]], begin: float, end: float) -> dict[str, Any]:
    """Acquire round trips and loop lag while every worker crawls (start-up and wind-down out).

    On a small machine the workers' start-ups (importing Scrapy, queueing
    the start requests) take the CPU from the others for a second or so; a
    reply that arrives meanwhile waits for its loop. The whole-run figures
    above keep those; these show the steady state the rate is measured in.
    """
    pooled: list[float] = []
    worst: float | None = None
    lags: list[float] = []
    for w in workers:
        inside = sorted(took for t, took in w.get("rtt_series", []) if begin <= t < end)
        pooled += inside
        p99 = pct(inside, 0.99)
        if p99 is not None:
            worst = p99 if worst is None else max(worst, p99)
        lags += [lag for t, lag in w.get("lag_series", []) if begin <= t < end]
    pooled.sort()
    return {
        "steady_acquires": len(pooled),
        "steady_acquire_p50_ms": pct(pooled, 0.5),
        "steady_acquire_p99_ms": pct(pooled, 0.99),
        "steady_acquire_p99_ms_worst_worker": worst,
        "steady_lag_p99_ms": pct(sorted(lags), 0.99),
    }
