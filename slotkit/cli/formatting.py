"""``explain``'s text output: how single values read, and the report
``python -m slotkit explain`` prints."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from slotkit.cli.explanation import Explanation, Value

# --------------------------------------------------------------------------- explain: formatting


def _seconds(value: float) -> str:
    return f"{value:g} s"


def _jitter(value: Sequence[float]) -> str:
    low, high = value
    if low == high == 0:
        return "none"
    if low == -high:
        return f"±{high:.0%}"
    return f"{low:+.0%} to {high:+.0%}"


def _rampup(rampup: Any) -> str:
    low, high = rampup.target
    target = f"{low}" if low == high else f"{low}-{high}"
    return (
        f"on: {target} backoff(s) per {rampup.window:g} s, delay x{rampup.delay_factor:g} "
        f"per step down to {rampup.min_delay:g} s"
    )


def _class_path(value: Any) -> str:
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return str(value)


def _codes(codes: frozenset[int]) -> str:
    return ", ".join(str(code) for code in sorted(codes))


#: Values longer than this push their source further right instead of widening the column.
VALUE_WIDTH = 24


def format_explanation(explanation: Explanation) -> str:
    """The text ``python -m slotkit explain`` prints."""
    lines = [f"URL: {explanation.url}"]
    manager = explanation.crawl["manager"]
    lines.append(f"Throttling manager: {manager.shown} ({manager.source})")
    if explanation.manager_note:
        lines.append(f"  note: {explanation.manager_note}")
    lines.append("")
    if not explanation.scopes:
        lines.append(
            "No scopes: the request is not throttled (only CONCURRENT_REQUESTS limits it)."
        )
    else:
        count = len(explanation.scopes)
        ids = ", ".join(scope.id for scope in explanation.scopes)
        lines.append(f"{count} scope{'s' if count > 1 else ''}: {ids}")
        if count > 1:
            lines.append("The request is sent only when every one of its scopes allows it.")
    for scope in explanation.scopes:
        lines.append("")
        tags = [f"{scope.kind} scope"]
        if scope.primary:
            tags.append("primary: reported as download_slot")
        if scope.amount is not None:
            tags.append(f"quota amount {scope.amount:g}")
        lines.append(f"Scope {scope.id!r} ({'; '.join(tags)})")
        rows: list[tuple[str, Value | None]] = [
            (f"  {name}", value) for name, value in scope.limits.items()
        ]
        rows.append(("  backoff", None))
        rows += [(f"    {name}", value) for name, value in scope.backoff.items()]
        name_width = max(len(name) for name, _ in rows)
        value_width = min(VALUE_WIDTH, max(len(v.shown) for _, v in rows if v is not None))
        for name, row in rows:
            if row is None:
                lines.append(name)
            else:
                lines.append(f"{name:<{name_width}}  {row.shown:<{value_width}}  {row.source}")
        lines += [f"  note: {note}" for note in scope.notes]
    lines.append("")
    lines.append("Crawl-wide")
    crawl = [(name, value) for name, value in explanation.crawl.items() if name != "manager"]
    name_width = max(len(name) for name, _ in crawl)
    value_width = min(VALUE_WIDTH, max(len(value.shown) for _, value in crawl))
    for name, value in crawl:
        lines.append(f"  {name:<{name_width}}  {value.shown:<{value_width}}  {value.source}")
    if explanation.notes:
        lines.append("")
        lines.append("Notes")
        lines += [f"  - {note}" for note in explanation.notes]
    return "\n".join(lines)
