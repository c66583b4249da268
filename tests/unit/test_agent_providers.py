"""Bundle stats providers: a load-report JSON from a file, an HTTP URL or a Pulsar broker."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from loadbalance.errors import InvalidReport, Transient
from producers.bundle_stats import (
    PULSAR_LOAD_REPORT_PATH,
    EmptyStatsProvider,
    FileStatsProvider,
    HttpStatsProvider,
    PulsarStatsProvider,
    provider_from_spec,
)

B1 = "public/default/0x00000000_0x40000000"
B2 = "public/default/0x40000000_0x80000000"

# shaped like `pulsar-admin broker-stats load-report` output (trimmed, with extra fields)
PULSAR_REPORT = {
    "webServiceUrl": "http://broker-1:8080",
    "pulsarServiceUrl": "pulsar://broker-1:6650",
    "persistentTopicsEnabled": True,
    "cpu": {"usage": 120.5, "limit": 400.0},
    "memory": {"usage": 900.0, "limit": 2048.0},
    "msgRateIn": 30.0,
    "numBundles": 2,
    "bundles": [B1, B2],
    "lastStats": {
        B1: {
            "msgRateIn": 30.0,
            "msgRateOut": 60.0,
            "msgThroughputIn": 3000.0,
            "msgThroughputOut": 6000.0,
            "consumerCount": 2,
            "producerCount": 1,
            "topics": 5,
            "cacheSize": 0,
        }
    },
    "lastUpdate": 1700000000000,
    "loadReportType": "LocalBrokerData",
}


def test_file_provider_keeps_bundles_and_last_stats_of_a_pulsar_report(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(PULSAR_REPORT))
    snap = FileStatsProvider(path).fetch()
    assert snap.bundles == {B1, B2}  # B2 is served but has no stats yet
    s = snap.last_stats[B1]
    assert (s.msg_rate_in, s.msg_throughput_out, s.topics, s.consumer_count) == (30, 6000, 5, 2)


@pytest.mark.parametrize(
    ("content", "field"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        (json.dumps({"lastStats": [1]}), "lastStats"),
        (json.dumps({"bundles": "t/ns/0x0_0x1"}), "bundles"),
        (json.dumps({"bundles": [B1, "public/default/0x20000000_0x60000000"]}), "overlap"),
    ],
    ids=["syntax", "not-object", "stats-not-object", "bundles-not-list", "overlap"],
)
def test_file_provider_rejects_bad_input_naming_the_file_and_field(
    tmp_path: Path, content: str, field: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(InvalidReport) as e:
        FileStatsProvider(path).fetch()
    assert str(path) in str(e.value) and field in str(e.value)


def test_missing_file_is_transient(tmp_path: Path) -> None:
    with pytest.raises(Transient, match="does not exist"):
        FileStatsProvider(tmp_path / "absent.json").fetch()


class _Handler(BaseHTTPRequestHandler):
    routes: ClassVar[dict[str, tuple[int, bytes]]] = {}
    seen_headers: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        type(self).seen_headers.append(dict(self.headers))
        status, body = self.routes.get(self.path, (404, b"not found"))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:  # keep test output quiet
        pass


@pytest.fixture
def http_server() -> Iterator[str]:
    """A tiny HTTP server on a free loopback port; yields its base URL."""
    _Handler.routes = {
        "/stats.json": (200, json.dumps(PULSAR_REPORT).encode()),
        PULSAR_LOAD_REPORT_PATH: (200, json.dumps(PULSAR_REPORT).encode()),
        "/garbage": (200, b"<html>oops</html>"),
        "/broken": (503, b"busy"),
    }
    _Handler.seen_headers = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_http_provider_reads_the_same_json(http_server: str) -> None:
    snap = HttpStatsProvider(f"{http_server}/stats.json").fetch()
    assert snap.bundles == {B1, B2} and snap.last_stats[B1].producer_count == 1


def test_pulsar_provider_reads_the_broker_stats_load_report_with_token(http_server: str) -> None:
    snap = PulsarStatsProvider(http_server + "/", token="s3cret").fetch()
    assert snap.bundles == {B1, B2}
    assert _Handler.seen_headers[-1]["Authorization"] == "Bearer s3cret"


def test_http_provider_errors_are_classified(http_server: str) -> None:
    with pytest.raises(InvalidReport, match="not valid JSON"):
        HttpStatsProvider(f"{http_server}/garbage").fetch()
    with pytest.raises(InvalidReport, match="HTTP 404"):
        HttpStatsProvider(f"{http_server}/missing").fetch()
    with pytest.raises(Transient, match="HTTP 503"):
        HttpStatsProvider(f"{http_server}/broken").fetch()


def test_unreachable_endpoint_is_transient() -> None:
    with socket.socket() as s:  # a port that was free a moment ago and now has no listener
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(Transient):
        HttpStatsProvider(f"http://127.0.0.1:{port}/x", 1.0).fetch()


def test_provider_spec_parsing(tmp_path: Path) -> None:
    assert isinstance(provider_from_spec(None), EmptyStatsProvider)
    assert isinstance(provider_from_spec(f"file:{tmp_path}/r.json"), FileStatsProvider)
    http = provider_from_spec("http:http://127.0.0.1:1/s.json")
    assert isinstance(http, HttpStatsProvider) and http.url == "http://127.0.0.1:1/s.json"
    pulsar = provider_from_spec("pulsar:http://broker:8080")
    assert isinstance(pulsar, PulsarStatsProvider)
    assert pulsar.url == "http://broker:8080" + PULSAR_LOAD_REPORT_PATH
    for bad in ("ftp:x", "file:", "nonsense", "http:not-a-url"):
        with pytest.raises(ValueError):
            provider_from_spec(bad)
