"""`python -m deploy dashboard` (issue 41 §2): Cloud Monitoring's own message parses what it
writes, and gcloud's own parser takes the command that creates it."""

from __future__ import annotations

import json

from google.cloud import monitoring_dashboard_v1

from deploy import monitoring
from schedules.config import SchedulerJob
from tests.support.gcloud import PARSED, parse


def job(name: str) -> SchedulerJob:
    return SchedulerJob(name=name, target="invoice", schedule="0 * * * *", project="acme-prod", location="us-central1")


def test_the_dashboard_parses_as_cloud_monitorings_dashboard():
    (board,) = monitoring.dashboards([job("invoice-hourly"), job("digest-hourly")])
    parsed = monitoring_dashboard_v1.Dashboard.from_json(json.dumps(board), ignore_unknown_fields=False)
    tiles = parsed.mosaic_layout.tiles
    assert parsed.display_name == "Dedup: Scheduler jobs" and len(tiles) == 4 * 3
    # The fleet on top, then a row a job: its outcomes, schedule delay, duration and attempts.
    assert {tile.y_pos for tile in tiles[:4]} == {0} and {tile.y_pos for tile in tiles[4:8]} == {4}
    assert [tile.widget.title for tile in tiles[8:]] == [
        "digest-hourly → invoice: outcomes",
        "digest-hourly → invoice: schedule delay (s)",
        "digest-hourly → invoice: run duration (s)",
        "digest-hourly → invoice: attempts",
    ]
    for tile in tiles[8:]:
        for data_set in tile.widget.xy_chart.data_sets:
            assert 'metric.label.scheduler_job="digest-hourly"' in data_set.time_series_query.time_series_filter.filter
    assert all(tile.x_pos + tile.width <= parsed.mosaic_layout.columns for tile in tiles)


def test_a_large_fleet_gets_a_dashboard_per_24_jobs():
    boards = monitoring.dashboards([job(f"job-{n:03}") for n in range(50)])
    assert [len(b["mosaicLayout"]["tiles"]) for b in boards] == [4 * 25, 4 * 25, 4 * 3]
    assert boards[2]["displayName"] == "Dedup: Scheduler jobs (3 of 3)"
    assert monitoring.file_names("dedup-dashboard", 3) == [
        "dedup-dashboard-1.json",
        "dedup-dashboard-2.json",
        "dedup-dashboard-3.json",
    ]


def test_its_gcloud_command_parses_with_gclouds_own_parser(tmp_path):
    (board,) = monitoring.dashboards([job("invoice-hourly")])
    (tmp_path / "dedup-dashboard.json").write_text(json.dumps(board))
    code, said = parse("gcloud monitoring dashboards create --config-from-file=dedup-dashboard.json", tmp_path)
    assert code != 2 and PARSED in said, said[-2000:]
