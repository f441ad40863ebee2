"""SlotOrder against a model that looks at every slot: groups, supersession, compaction."""

from __future__ import annotations

import random

import pytest

from slotkit import pqueue_order
from slotkit.pqueue_order import SHARE, Rank, SlotOrder
from slotkit.pqueue_quota import Terms

GROUPS: list[Terms | None] = [None, (("budget", 1.0),), (("budget", 2.0),), (("api", 1.0),)]


def best(filed: dict[str, tuple[Rank, Terms | None]], shares: dict[Terms, float]) -> str | None:
    """The slot with the best rank, a grouped slot's share being its group's now."""
    ranked = [
        ((*rank[:SHARE], shares[group], *rank[SHARE + 1 :]) if group else rank, slot)
        for slot, (rank, group) in filed.items()
    ]
    return min(ranked)[1] if ranked else None


@pytest.mark.parametrize("seed", range(20))
def test_take_best_is_the_best_filed_slot(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pqueue_order, "SLACK", 4)  # rebuild the heaps often
    rng = random.Random(seed)
    order = SlotOrder()
    filed: dict[str, tuple[Rank, Terms | None]] = {}
    shares: dict[Terms, float] = {}
    slots = [f"s{i}" for i in range(8)]
    for _ in range(500):
        action = rng.random()
        slot = rng.choice(slots)
        if action < 0.45:
            group = rng.choice(GROUPS)
            share = shares.get(group, -rng.random()) if group else 0.0
            rank: Rank = (rng.randrange(3), -rng.randrange(2), share, rng.randrange(4))
            order.offer(slot, rank, group)
            filed[slot] = (rank, group)
            if group:
                shares[group] = share
        elif action < 0.55:
            order.discard(slot)
            filed.pop(slot, None)
        elif action < 0.7:
            for group in order.groups():
                # Spending elsewhere: a group's share only grows (its rank improves).
                shares[group] = shares[group] - rng.random()
                order.refresh(group, shares[group])
        else:
            expected = best(filed, shares)
            taken = order.take_best()
            assert (taken[1] if taken else None) == expected
            if taken is not None:
                rank, group = filed.pop(taken[1])
                assert taken[2] == group
        assert {slot for slot in slots if order.offered(slot)} == set(filed)
        assert set(order.groups()) == {group for _, group in filed.values() if group}
