"""A PACS that is slow or answers 5xx (issue 48, bad input): the sync retries with back-off
and completes; past the cohort's ``[sync] retries`` it stops in one line naming the PACS, the
store is left as it was, and the next sync continues where it stopped.

Between the sync and the real Orthanc sits a small HTTP proxy (:class:`FlakyProxy`, a threading
``http.server`` forwarding every request) that answers 503 to chosen requests, or holds them
before forwarding, and counts what it saw. No timer is asserted; every wait is bounded.
"""

from __future__ import annotations

import http.client
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import clients.pacs.dicomweb as dicomweb
from clients.pacs.cohort import load_cohort
from clients.pacs.errors import PacsError
from clients.pacs.sync import store_dir, sync_cohort
from clients.pe_seg.manifest import read_manifest

#: What the proxy does no longer than (a held request is released at teardown at the latest).
HOLD_CAP_S = 10.0
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}
QIDO_STUDIES = re.compile(r"/dicom-web/studies(\?.*)?")
WADO_SERIES = re.compile(r"/dicom-web/studies/[^/?]+/series/[^/?]+")


@dataclass
class Rule:
    """Answer 503 to (or hold for ``hold_s``) ``count`` requests matching ``path``, once
    ``after`` matching ones were forwarded."""

    path: re.Pattern[str]
    count: int
    after: int = 0
    hold_s: float = 0.0
    seen: int = 0


@dataclass
class FlakyProxy:
    """The proxy's state: the rules in force and every request it saw (method, path, answer)."""

    target_port: int
    rules: list[Rule] = field(default_factory=list)
    seen: list[tuple[str, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    released: threading.Event = field(default_factory=threading.Event)
    port: int = 0

    def decide(self, path: str) -> tuple[str, float]:
        """What to do with a request to ``path``: ``("503", 0)``, ``("hold", s)`` or ``("forward", 0)``."""
        with self.lock:
            for rule in self.rules:
                if rule.path.fullmatch(path):
                    rule.seen += 1
                    if rule.after < rule.seen <= rule.after + rule.count:
                        return ("hold", rule.hold_s) if rule.hold_s else ("503", 0.0)
            return "forward", 0.0

    def answered(self, path: str, what: str) -> int:
        """How many requests to ``path`` got ``what`` (``503``, ``hold``, ``forward``)."""
        with self.lock:
            return sum(1 for _, p, w in self.seen if w == what and re.fullmatch(path, p))


def _handler(proxy: FlakyProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # quiet
            pass

        def _any(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            what, hold_s = proxy.decide(self.path)
            with proxy.lock:
                proxy.seen.append((self.command, self.path, what))
            if what == "503":
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if what == "hold":
                proxy.released.wait(min(hold_s, HOLD_CAP_S))
            upstream = http.client.HTTPConnection("127.0.0.1", proxy.target_port, timeout=60)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                upstream.request(self.command, self.path, body=body or None, headers=headers)
                answer = upstream.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in _HOP:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up waiting (a held request): nothing to answer
            finally:
                upstream.close()

        do_GET = do_POST = do_PUT = do_DELETE = _any

    return Handler


@pytest.fixture
def proxy_factory() -> Iterator[Callable[[int], FlakyProxy]]:
    servers: list[tuple[ThreadingHTTPServer, threading.Thread, FlakyProxy]] = []

    def start(target_port: int) -> FlakyProxy:
        proxy = FlakyProxy(target_port)
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(proxy))
        server.daemon_threads = True
        proxy.port = server.server_address[1]
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                  daemon=True)
        thread.start()
        servers.append((server, thread, proxy))
        return proxy

    yield start
    for server, thread, proxy in servers:
        proxy.released.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=HOLD_CAP_S)
        assert not thread.is_alive()


def _through(hospital, proxy: FlakyProxy, name: str, parallel: int = 1) -> Path:
    """A DICOMweb cohort file of ``hospital`` whose URL is the proxy's; one study at a time
    unless ``parallel`` (the rules count requests in the order they come)."""
    path = hospital.cohort_file("dicomweb", name=name)
    port = hospital.orthanc.http_port
    path.write_text(path.read_text().replace(f":{port}/", f":{proxy.port}/")
                    .replace("[sync]\n", f"[sync]\nparallel = {parallel}\n"))
    assert f":{proxy.port}/" in path.read_text()
    return path


def _manifest(cohort, state: Path) -> str | None:
    path = store_dir(cohort, state) / "manifest.csv"
    return path.read_text() if path.is_file() else None


def test_503s_within_the_retries_are_retried_and_the_sync_completes(hospital, proxy_factory,
                                                                     tmp_path):
    proxy = proxy_factory(hospital.orthanc.http_port)
    proxy.rules.append(Rule(QIDO_STUDIES, count=2))  # the cohort file: retries = 2
    proxy.rules.append(Rule(WADO_SERIES, count=2, after=1))  # the second study's series, twice
    cohort = load_cohort(_through(hospital, proxy, "flaky-503"))
    report = sync_cohort(cohort, tmp_path / "state")
    assert (report.synced, report.fetched_studies, report.skipped) == (3, 3, {})
    assert proxy.answered(QIDO_STUDIES.pattern, "503") == 2
    assert proxy.answered(QIDO_STUDIES.pattern, "forward") == 1  # the third attempt
    assert proxy.answered(WADO_SERIES.pattern, "503") == 2
    assert proxy.answered(WADO_SERIES.pattern, "forward") == 3  # one per study
    assert len(read_manifest(store_dir(cohort, tmp_path / "state"))) == 3


def test_a_slow_pacs_is_waited_for_and_one_past_the_timeout_is_retried(hospital, proxy_factory,
                                                                      tmp_path, monkeypatch):
    # A held request is answered after HOLD_CAP_S (10 s), past this timeout; a slow one
    # (0.2 s) stays far within it even on a loaded machine.
    monkeypatch.setattr(dicomweb, "_TIMEOUT_S", 5.0)
    proxy = proxy_factory(hospital.orthanc.http_port)
    proxy.rules.append(Rule(QIDO_STUDIES, count=1, hold_s=HOLD_CAP_S))  # past the timeout
    proxy.rules.append(Rule(WADO_SERIES, count=3, hold_s=0.2))  # slow, within it
    cohort = load_cohort(_through(hospital, proxy, "flaky-slow"))
    report = sync_cohort(cohort, tmp_path / "state")
    assert (report.synced, report.fetched_studies, report.skipped) == (3, 3, {})
    assert proxy.answered(QIDO_STUDIES.pattern, "hold") == 1
    assert proxy.answered(QIDO_STUDIES.pattern, "forward") == 1  # the retry
    assert proxy.answered(WADO_SERIES.pattern, "hold") == 3  # slow, none retried
    assert proxy.answered(WADO_SERIES.pattern, "forward") == 0


def test_more_503s_than_the_retries_stop_the_sync_in_one_line_and_the_next_continues(
        hospital, proxy_factory, tmp_path):
    proxy = proxy_factory(hospital.orthanc.http_port)
    cohort = load_cohort(_through(hospital, proxy, "flaky-down"))
    state = tmp_path / "state"
    proxy.rules.append(Rule(WADO_SERIES, count=3, after=1))  # the second study: 3 = 1 + retries
    with pytest.raises(PacsError) as stopped:
        sync_cohort(cohort, state)
    line = str(stopped.value)
    assert "\n" not in line
    assert re.fullmatch(rf"DICOMweb http://127\.0\.0\.1:{proxy.port}/dicom-web WADO series: "
                        r"HTTP 503 \(after 3 attempts\)", line), line
    assert proxy.answered(WADO_SERIES.pattern, "503") == 3
    assert _manifest(cohort, state) is None  # no manifest yet: nothing half-written
    then = sync_cohort(cohort, state)  # the PACS answers again
    assert (then.synced, then.skipped) == (3, {})
    assert then.fetched_studies == 2  # the first study was kept: continued where it stopped
    synced = _manifest(cohort, state)
    proxy.rules[:] = [Rule(QIDO_STUDIES, count=3)]
    with pytest.raises(PacsError, match=rf"^DICOMweb http://127\.0\.0\.1:{proxy.port}/dicom-web "
                                        r"QIDO studies: HTTP 503 \(after 3 attempts\)$"):
        sync_cohort(cohort, state)
    assert _manifest(cohort, state) == synced  # the store left as it was
    again = sync_cohort(cohort, state)
    assert (again.synced, again.fetched_studies, again.removed) == (3, 0, 0)
    assert _manifest(cohort, state) == synced


def test_a_study_failing_past_its_retries_stops_the_parallel_sync_and_the_next_continues(
        hospital, proxy_factory, tmp_path):
    proxy = proxy_factory(hospital.orthanc.http_port)
    cohort = load_cohort(_through(hospital, proxy, "flaky-parallel", parallel=3))
    assert cohort.sync.parallel == 3
    state = tmp_path / "state"
    proxy.rules.append(Rule(WADO_SERIES, count=100, after=1))  # only the first series answered
    with pytest.raises(PacsError, match=r"WADO series: HTTP 503 \(after 3 attempts\)$"):
        sync_cohort(cohort, state)
    assert _manifest(cohort, state) is None
    proxy.rules.clear()
    then = sync_cohort(cohort, state)
    assert (then.synced, then.skipped) == (3, {})
    assert then.fetched_studies == 2  # the study fetched before the stop was kept
    assert len(read_manifest(store_dir(cohort, state))) == 3
