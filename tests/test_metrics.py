"""Issue 32 item 5 (unit): per-batch metrics from Spark's progress report, as JSON lines and Prometheus
text. The real query exporting them is integration/test_metrics_export.py."""

from __future__ import annotations

import io
import json
import urllib.request

from connectors import metrics

PROGRESS = {
    "id": "q-1",
    "name": "payments",
    "batchId": 7,
    "timestamp": "2026-11-25T10:00:00.000Z",
    "numInputRows": 120,
    "durationMs": {"addBatch": 850, "latestOffset": 12, "triggerExecution": 990},
    "sources": [
        {
            "description": "kafka-eos",
            "startOffset": {"payments": {"0": 100, "1": 40}},
            "endOffset": {"payments": {"0": 180, "1": 80}},
            "latestOffset": {"payments": {"0": 250, "1": 80}},
            "numInputRows": 120,
        }
    ],
    "sink": {"description": "postgres-2pc", "numOutputRows": -1},
}


def test_progress_gives_records_lag_per_partition_and_times() -> None:
    m = metrics.from_progress(PROGRESS, "payments-raw")
    assert (m.query, m.batch_id, m.source_records, m.sink_rows) == ("payments", 7, 120, 120)
    assert m.source_lag == {"payments": {"0": 70, "1": 0}}
    assert (m.source_latest_offset_ms, m.sink_write_ms, m.batch_ms) == (12, 850, 990)
    # offsets as JSON text (older Spark) read the same
    text = {**PROGRESS, "sources": [{k: json.dumps(v) for k, v in PROGRESS["sources"][0].items()}]}
    assert metrics.from_progress(text).source_lag == {"payments": {"0": 70, "1": 0}}


def test_json_line_textfile_and_http_endpoint(tmp_path) -> None:
    out = io.StringIO()
    exporter = metrics.EosMetrics(
        sink_id={"payments": "payments-raw"}, textfile=str(tmp_path / "eos.prom"), json_stream=out, http_port=0
    )
    try:
        exporter.record(PROGRESS)
        exporter.record({**PROGRESS, "batchId": 8, "numInputRows": 30})
        lines = [json.loads(line) for line in out.getvalue().splitlines()]
        assert [(x["event"], x["batch_id"], x["sink_rows"], x["sink_id"]) for x in lines] == [
            ("spark_eos.batch", 7, 120, "payments-raw"),
            ("spark_eos.batch", 8, 30, "payments-raw"),
        ]
        text = (tmp_path / "eos.prom").read_text()
        assert "# TYPE spark_eos_source_lag_offsets gauge" in text
        assert 'spark_eos_source_lag_offsets{query="payments",query_id="q-1",topic="payments",partition="0"} 70' in text
        assert 'spark_eos_sink_rows_total{query="payments",query_id="q-1",sink_id="payments-raw"} 150' in text
        assert 'spark_eos_batch_id{query="payments",query_id="q-1"} 8' in text
        port = exporter.server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            assert resp.status == 200 and resp.read().decode() == text
    finally:
        exporter.close()


def test_a_failing_database_never_fails_the_batch(caplog) -> None:
    exporter = metrics.EosMetrics(dsn="postgresql://u:Sekr3t@127.0.0.1:1/d", sink_id="s", json_stream=io.StringIO())
    m = exporter.record(PROGRESS)
    assert m.sink_rows == 120 and m.prepared_transactions is None
    assert "reading the sink's records failed" in caplog.text and "Sekr3t" not in caplog.text


def test_close_removes_the_listener_it_installed() -> None:
    """Over Spark Connect the listener runs in the client on a thread of PySpark's that keeps the process alive
    until the listener is removed (integration/test_spark_connect.py): ``close()`` removes it, once."""

    class Streams:
        def __init__(self) -> None:
            self.listeners: list[object] = []

        def addListener(self, listener: object) -> None:
            self.listeners.append(listener)

        def removeListener(self, listener: object) -> None:
            self.listeners.remove(listener)

    class Session:
        streams = Streams()

    spark = Session()
    exporter = metrics.install(spark)
    assert spark.streams.listeners == [exporter.listener]
    exporter.close()
    assert spark.streams.listeners == []
    exporter.close()  # again: nothing left to remove, no error
