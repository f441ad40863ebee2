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
@pytest.mark.parametrize("values", [3, 1], ids=["varied", "ties"])
def test_take_best_is_the_best_filed_slot(
    seed: int, values: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """*values*: how many values each rank item takes (1: ties everywhere, names decide)."""
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
            share = shares.get(group, -rng.randrange(values) / 4) if group else 0.0
            rank: Rank = (
                rng.randrange(values),
                -rng.randrange(values),
                share,
                rng.randrange(values),
            )
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
                shares[group] = shares[group] - rng.randrange(values) / 4
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


BUDGET: Terms = (("budget", 1.0),)
API: Terms = (("api", 1.0),)
EQUAL: Rank = (0, 0, -0.1, 0)


def test_a_tie_goes_by_name_after_the_groups_named_member_leaves() -> None:
    """A group's entry is named after its best member; that member gone, the
    entry still carried its name and went before an equal 'b'."""
    order = SlotOrder()
    order.offer("a", EQUAL, BUDGET)
    order.offer("c", EQUAL, BUDGET)
    order.offer("b", EQUAL, API)
    order.discard("a")
    assert [order.take_best()[1] for _ in range(2)] == ["b", "c"]  # type: ignore[index]


def test_a_tie_goes_by_name_after_the_named_member_changes_group() -> None:
    order = SlotOrder()
    order.offer("a", EQUAL, BUDGET)
    order.offer("c", EQUAL, BUDGET)
    order.offer("b", EQUAL)
    order.offer("a", (1, 0, -0.1, 0), API)  # busier, and its new head spends another quota
    assert [order.take_best()[1] for _ in range(3)] == ["b", "c", "a"]  # type: ignore[index]
