"""A fleet of hosts' exporters behind one loopback port, each host its own scrape target with its own target
labels given by file_sd (as a site's inventory would give rack and row), for a real Prometheus to scrape.

    with SyntheticFleet() as fleet:
        fleet.host("gpu-node-01").set(DCGM_GPU_TEMP, dcgm_labels(0, hostname="gpu-node-01"), 45)
        config = fleet.scrape_config(tmp / "targets.json", {"gpu-node-01": {"rack": "C2"}})

`/hosts/<name>/metrics` serves that host's series (a SyntheticExporter's registry, never started on its own
port); file_sd gives each host's target its `__metrics_path__`, its `instance` (`<name>:9400`, as if each host
ran its own exporter), `host` and the labels given. A relabelling rule derives `row` from `rack` ("C2" -> "C"),
as sites derive one location label from another.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import generate_latest
from prometheus_client.exposition import ThreadingWSGIServer

from tests.support.exporter import SyntheticExporter

_PATH = re.compile(r"/hosts/([^/]+)/metrics")
EXPORTER_PORT = 9400


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return


class SyntheticFleet:
    def __init__(self) -> None:
        self._hosts: dict[str, SyntheticExporter] = {}
        self._lock = threading.Lock()
        self._server: WSGIServer | None = None
        self.port = 0

    def host(self, name: str) -> SyntheticExporter:
        """The exporter of one host (created empty the first time)."""
        with self._lock:
            return self._hosts.setdefault(name, SyntheticExporter())

    def _app(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        match = _PATH.fullmatch(environ.get("PATH_INFO", ""))
        with self._lock:
            exporter = self._hosts.get(match.group(1)) if match else None
        if exporter is None:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"no such host\n"]
        body = generate_latest(exporter.registry)
        start_response("200 OK", [("Content-Type", "text/plain; version=0.0.4; charset=utf-8")])
        return [body]

    def start(self) -> SyntheticFleet:
        self._server = make_server("127.0.0.1", 0, self._app, ThreadingWSGIServer, handler_class=_Quiet)
        self.port = self._server.server_port
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> SyntheticFleet:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    def target_labels(self, name: str, labels: Mapping[str, str]) -> dict[str, str]:
        """The labels Prometheus puts on every series of the host's target (`row` derived from `rack`)."""
        derived = {"row": labels["rack"][0]} if "rack" in labels else {}
        return {"instance": f"{name}:{EXPORTER_PORT}", "job": "node", "host": name, **labels, **derived}

    def scrape_config(
        self, targets_file: Path, labels: Mapping[str, Mapping[str, str]], interval: str = "1s"
    ) -> dict[str, Any]:
        """A Prometheus config scraping every host in `labels` (host -> its file_sd labels) via file_sd."""
        groups = [
            {
                "targets": [f"127.0.0.1:{self.port}"],
                "labels": {
                    "__metrics_path__": f"/hosts/{name}/metrics",
                    "instance": f"{name}:{EXPORTER_PORT}",
                    "host": name,
                    **own,
                },
            }
            for name, own in labels.items()
        ]
        targets_file.write_text(json.dumps(groups))
        relabel = {"source_labels": ["rack"], "regex": "([A-Z]+)[0-9]+", "target_label": "row", "replacement": "$1"}
        return {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [
                {
                    "job_name": "node",
                    "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "1s"}],
                    "relabel_configs": [relabel],
                }
            ],
        }
