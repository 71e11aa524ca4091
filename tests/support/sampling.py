"""A spread sample of a large input class for `make check`; the whole class for `make test`.

A test marked ``@pytest.mark.sample(N)`` keeps N of its parametrized cases, evenly spread
over the class in collection order (the first and the last among them), in the fast tier.
Its other cases are marked ``exhaustive``, which `make check` deselects and `make test` runs,
so the class is still tested case by case on every CI run.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import pytest


def spread(count: int, keep: int) -> set[int]:
    """``keep`` of the positions ``0 .. count - 1``, evenly spaced, the first and the last among them."""
    if keep < 1:
        raise ValueError(f"a sample keeps at least one case, not {keep}")
    if keep >= count:
        return set(range(count))
    if keep == 1:
        return {0}
    return {round(i * (count - 1) / (keep - 1)) for i in range(keep)}


def mark_outside_samples(items: Sequence[pytest.Item]) -> None:
    """Mark ``exhaustive`` each case of a ``sample``-marked test that its spread leaves out."""
    groups: dict[tuple[str, str], list[pytest.Item]] = collections.defaultdict(list)
    for item in items:
        if item.get_closest_marker("sample") is not None:
            groups[(str(item.path), getattr(item, "originalname", item.name))].append(item)
    for group in groups.values():
        marker = group[0].get_closest_marker("sample")
        assert marker is not None
        kept = spread(len(group), int(marker.args[0]))
        for index, item in enumerate(group):
            if index not in kept:
                item.add_marker(pytest.mark.exhaustive)
