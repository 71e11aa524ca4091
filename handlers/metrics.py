"""Metrics: the process's meter provider, its export to Cloud Monitoring, and the 409s answered.

The instruments are made where what they count happens, with the OpenTelemetry API alone:
the slots' outcomes, delay, duration and attempts (schedules/metrics.py), the protocol's
takeovers, stale attempts and claim round trips (dedup/metrics.py); this module gives the
process its provider once, and counts the requests answered 409 (``dedup.answers.conflicts``).

Where metrics go is ``DEDUP_METRICS_EXPORT``, as ``DEDUP_TRACE_EXPORT`` says where spans go:
``cloud-monitoring`` (the default on App Engine: Google's exporter, every EXPORT_SECONDS from a
background thread, on the monitored resource Google's resource detector finds) or ``none``
(the default elsewhere: measured, exported nowhere).  Tests add an in-memory reader.

Two things make the export cheap and correct on App Engine.  Each process writes series of its
own (the exporter's ``opentelemetry_id`` label): two gunicorn workers of one instance would
otherwise write one series and be refused.  And a series is written only when its value changed
since the last export (``ChangedOnly``): Cloud Monitoring bills every point written, and the
SDK's cumulative export repeats every series a process ever touched, every interval, for as long
as it lives; written only on change, a cumulative series still adds up (its points keep their
start time), and a job that stops running stops writing, which is what the forward-progress
alert (python -m deploy alerts) waits for.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import google.auth.exceptions
from flask import Flask, Response, g
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    NumberDataPoint,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource, get_aggregated_resources

from dedup.metrics import CONFLICTS_NAME, labels
from schedules.metrics import METRIC_TYPE_PREFIX
from settings import Settings

log = logging.getLogger(__name__)
_configured = threading.Lock()
# How often a process writes its changed series (Google's exporter asks 60 s at least between
# two writes of a series: Cloud Monitoring refuses points of one series closer than that).
EXPORT_SECONDS = 60

meter = metrics.get_meter("dedup.requests")
CONFLICTS = meter.create_counter(
    CONFLICTS_NAME, unit="{request}", description="requests answered 409: a run in progress, contended, ..."
)


class ChangedOnly(MetricExporter):
    """An exporter that passes on only the points whose value changed since it last passed one of
    their series: a cumulative point repeated unchanged says nothing Cloud Monitoring does not know."""

    def __init__(self, exporter: MetricExporter) -> None:
        super().__init__(
            preferred_temporality=exporter._preferred_temporality,
            preferred_aggregation=exporter._preferred_aggregation,
        )
        self.exporter = exporter
        self._last: dict[tuple[str, frozenset[tuple[str, Any]]], Any] = {}

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        seen: dict[tuple[str, frozenset[tuple[str, Any]]], Any] = {}
        changed = self.changed(metrics_data, seen)
        if changed is None:
            return MetricExportResult.SUCCESS
        result = self.exporter.export(changed, timeout_millis=timeout_millis, **kwargs)
        if result == MetricExportResult.SUCCESS:
            # Only what was written is known to Cloud Monitoring: a failed export's points stay
            # changed, and the next export writes them again.
            self._last.update(seen)
        return result

    def changed(
        self, metrics_data: MetricsData, seen: dict[tuple[str, frozenset[tuple[str, Any]]], Any] | None = None
    ) -> MetricsData | None:
        """``metrics_data`` with only its changed points (None: nothing changed); their values go
        into ``seen``, for the caller to remember once they are written."""
        seen = {} if seen is None else seen
        resources = []
        for resource_metrics in metrics_data.resource_metrics:
            scopes = []
            for scope_metrics in resource_metrics.scope_metrics:
                kept = []
                for metric in scope_metrics.metrics:
                    points = [p for p in metric.data.data_points if self._moved(metric.name, p, seen)]
                    if points:
                        data: Any = dataclasses.replace(metric.data, data_points=points)  # type: ignore[type-var, arg-type]
                        kept.append(dataclasses.replace(metric, data=data))
                if kept:
                    scopes.append(dataclasses.replace(scope_metrics, metrics=kept))
            if scopes:
                resources.append(dataclasses.replace(resource_metrics, scope_metrics=scopes))
        return dataclasses.replace(metrics_data, resource_metrics=resources) if resources else None

    def _moved(self, name: str, point: Any, seen: dict[tuple[str, frozenset[tuple[str, Any]]], Any]) -> bool:
        series = (name, frozenset((point.attributes or {}).items()))
        value = _value(point)
        if self._last.get(series) == value:
            return False
        seen[series] = value
        return True

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.exporter.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.exporter.shutdown(timeout_millis=timeout_millis, **kwargs)


def _value(point: Any) -> Any:
    """What tells a point of a series from the last: a sum's value, a distribution's count and sum
    (with its start time, so a series begun again is written again)."""
    if isinstance(point, NumberDataPoint):
        return point.start_time_unix_nano, point.value
    if isinstance(point, HistogramDataPoint):
        return point.start_time_unix_nano, point.count, point.sum
    return point.time_unix_nano  # another kind: always passed on


def cloud_monitoring_exporter(settings: Settings, client: Any = None) -> MetricExporter:
    """Google's exporter to Cloud Monitoring, with a series per process (``opentelemetry_id``).

    Google marks this exporter deprecated in favour of OTLP to its telemetry API (another package
    and endpoint); it is the one issue 41 names, and it works: the warning is silenced here alone."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from opentelemetry.exporter.cloud_monitoring import CloudMonitoringMetricsExporter

        exporter: MetricExporter = CloudMonitoringMetricsExporter(
            project_id=settings.project, client=client, add_unique_identifier=True, prefix=METRIC_TYPE_PREFIX
        )
    return exporter


def detected_resource(settings: Settings) -> Resource:
    """The process's resource: its service, and where it runs as Google's resource detector finds it
    (on App Engine its region, service and instance: Cloud Monitoring's ``generic_task``)."""
    from opentelemetry.resourcedetector.gcp_resource_detector import GoogleCloudResourceDetector

    initial = Resource.create({"service.name": settings.service or "dedup"})
    return get_aggregated_resources([GoogleCloudResourceDetector(raise_on_error=False)], initial_resource=initial)


def configure_metrics(
    settings: Settings,
    exporter_for: Callable[[Settings], MetricExporter] = cloud_monitoring_exporter,
    readers: Sequence[MetricReader] = (),
) -> MeterProvider:
    """The process's meter provider, made once (OpenTelemetry allows one per process), exporting
    as ``settings.metrics_export`` says; ``readers`` are added to it (the tests' in-memory one)."""
    with _configured:
        current = metrics.get_meter_provider()
        if isinstance(current, MeterProvider):
            return current
        provider = new_provider(settings, exporter_for, readers)
        metrics.set_meter_provider(provider)
        return provider


def new_provider(
    settings: Settings,
    exporter_for: Callable[[Settings], MetricExporter],
    readers: Iterable[MetricReader] = (),
    resource_for: Callable[[Settings], Resource] = detected_resource,
) -> MeterProvider:
    """A provider exporting as ``settings.metrics_export`` says; one whose exporter cannot be built exports nothing."""
    all_readers = list(readers)
    resource = Resource.create({"service.name": settings.service or "dedup"})
    if settings.metrics_export == "cloud-monitoring":
        try:
            exporter = ChangedOnly(exporter_for(settings))
            all_readers.append(PeriodicExportingMetricReader(exporter, export_interval_millis=EXPORT_SECONDS * 1000))
            resource = resource_for(settings)
        except google.auth.exceptions.DefaultCredentialsError as exc:
            # Metrics are for looking: a missing credential must not stop the app serving runs.
            log.error("metrics will not be exported to Cloud Monitoring: %s", exc)
    return MeterProvider(metric_readers=all_readers, resource=resource)


def install_metrics(app: Flask) -> None:
    """Count every request answered 409, by the job and Scheduler job its log line names."""

    @app.after_request
    def count_conflict(response: Response) -> Response:
        if response.status_code == 409:
            fields = g.get("run_log", {})
            CONFLICTS.add(1, labels(str(fields.get("job_id") or ""), fields.get("scheduler_job"), fields.get("source")))
        return response
