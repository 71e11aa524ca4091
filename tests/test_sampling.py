"""tests/support/sampling.py: make check's spread sample of a large class, make test's whole class."""

from __future__ import annotations

import pytest

from tests.support.sampling import mark_outside_samples, spread


@pytest.mark.parametrize("keep", [1, 2, 3, 8, 12])
@pytest.mark.parametrize("count", [1, 2, 3, 7, 8, 9, 12, 13, 36, 73, 193])
def test_a_spread_keeps_that_many_cases_evenly_first_and_last_among_them(count, keep):
    kept = sorted(spread(count, keep))
    assert len(kept) == min(count, keep)
    assert kept[0] == 0 and all(0 <= i < count for i in kept)
    if keep > 1 and count > 1:
        assert kept[-1] == count - 1
        gaps = [b - a for a, b in zip(kept, kept[1:], strict=False)]
        assert max(gaps) - min(gaps) <= 1  # evenly spread, not bunched at one end


def test_a_sample_keeps_at_least_one_case():
    with pytest.raises(ValueError, match="at least one"):
        spread(5, 0)


class _Item:
    """What mark_outside_samples reads of a pytest item."""

    def __init__(self, path: str, name: str, keep: int | None) -> None:
        self.path, self.originalname, self.name = path, name, f"{name}[...]"
        self.marks = [pytest.mark.sample(keep).mark] if keep else []

    def get_closest_marker(self, name):
        return next((m for m in self.marks if m.name == name), None)

    def add_marker(self, marker):
        self.marks.append(marker.mark)


def test_the_cases_a_sample_leaves_out_are_exhaustive_and_other_tests_are_untouched():
    sampled = [_Item("tests/test_a.py", "test_class", 3) for _ in range(10)]
    same_name_elsewhere = [_Item("tests/test_b.py", "test_class", 3) for _ in range(2)]
    unmarked = [_Item("tests/test_a.py", "test_other", None) for _ in range(10)]
    mark_outside_samples([*sampled, *unmarked, *same_name_elsewhere])
    left_out = [i for i, item in enumerate(sampled) if item.get_closest_marker("exhaustive")]
    assert left_out == [1, 2, 3, 5, 6, 7, 8]  # 0, 4 (or 5) and 9 kept
    assert not any(item.get_closest_marker("exhaustive") for item in unmarked + same_name_elsewhere)
