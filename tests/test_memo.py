"""rlperf.memo.BoundedMemo: least recently used dropped first, a hit refreshes, make() once."""

from rlperf.memo import BoundedMemo


def test_the_least_recently_used_entry_is_dropped_past_the_bound() -> None:
    memo: BoundedMemo[str, int] = BoundedMemo(2)
    memo.put("a", 1)
    memo.put("b", 2)
    assert memo.get("a") == 1  # "a" is now the most recently used: "b" goes first
    memo.put("c", 3)
    assert len(memo) == 2
    assert memo.get("b") is None
    assert (memo.get("a"), memo.get("c")) == (1, 3)


def test_get_or_make_makes_once_per_key() -> None:
    memo: BoundedMemo[int, list[int]] = BoundedMemo(8)
    made: list[int] = []
    first = memo.get_or_make(1, lambda: made.append(1) or [1])
    again = memo.get_or_make(1, lambda: made.append(2) or [2])
    assert again is first and made == [1]
    memo.clear()
    assert len(memo) == 0 and memo.get(1) is None
