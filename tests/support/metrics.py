"""The metrics a test made, read from the process's in-memory reader (tests/conftest.py's
``measured``): each instrument's points since the test began, by their labels."""

from __future__ import annotations

import collections
from typing import Any

from opentelemetry.sdk.metrics import Counter, Histogram, UpDownCounter
from opentelemetry.sdk.metrics.export import AggregationTemporality, Gauge, HistogramDataPoint, InMemoryMetricReader

# Each read gives what changed since the last: a test drains the reader first, then sums its own.
DELTAS = {
    Counter: AggregationTemporality.DELTA,
    UpDownCounter: AggregationTemporality.DELTA,
    Histogram: AggregationTemporality.DELTA,
}


def in_memory_reader() -> InMemoryMetricReader:
    return InMemoryMetricReader(preferred_temporality=DELTAS)


class Measured:
    """What the metrics recorded since this test drained the reader."""

    def __init__(self, reader: InMemoryMetricReader) -> None:
        self.reader = reader
        self.sums: collections.Counter[tuple[str, frozenset[tuple[str, Any]]]] = collections.Counter()
        self.samples: dict[tuple[str, frozenset[tuple[str, Any]]], list[tuple[int, float]]] = {}
        self.last: dict[tuple[str, frozenset[tuple[str, Any]]], float] = {}  # a gauge's latest value
        self.reader.get_metrics_data()  # drain: what other tests left

    def read(self) -> Measured:
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        series = (metric.name, frozenset((point.attributes or {}).items()))
                        if isinstance(metric.data, Gauge):
                            self.last[series] = point.value
                        elif isinstance(point, HistogramDataPoint):
                            self.samples.setdefault(series, []).append((point.count, point.sum))
                        else:
                            self.sums[series] += point.value
        return self

    def counts(self, name: str, by: str, **where: str) -> dict[str, int]:
        """``name``'s sums since the test began, by the label ``by``, of the points whose labels match ``where``."""
        self.read()
        found: collections.Counter[str] = collections.Counter()
        for (metric, attributes), value in self.sums.items():
            labels = dict(attributes)
            if metric == name and value and all(labels.get(k) == v for k, v in where.items()):
                found[str(labels.get(by))] += int(value)
        return dict(found)

    def histogram(self, name: str, **where: str) -> tuple[int, float]:
        """How many values ``name`` recorded since the test began, and their sum, where the labels match."""
        self.read()
        count, total = 0, 0.0
        for (metric, attributes), samples in self.samples.items():
            labels = dict(attributes)
            if metric == name and all(labels.get(k) == v for k, v in where.items()):
                count += sum(c for c, _ in samples)
                total += sum(s for _, s in samples)
        return count, total

    def gauges(self, name: str, by: str, **where: str) -> dict[str, float]:
        """``name``'s latest values since the test began, by the label ``by``, where the labels match."""
        self.read()
        return {
            str(dict(attributes).get(by)): value
            for (metric, attributes), value in self.last.items()
            if metric == name and all(dict(attributes).get(k) == v for k, v in where.items())
        }
