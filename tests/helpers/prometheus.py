"""A real Prometheus server for the tests (Debian's ``prometheus``, installed by .ci/run): started
on a free loopback port with a scrape config of our own, asked through its HTTP API."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tests.helpers.net import free_port

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-perfmon.json"


def dashboard_queries(job: str) -> dict[str, str]:
    """Every PromQL expression of the Grafana dashboard, ``$job`` substituted, by its panel's
    title and the metric it reads."""
    out: dict[str, str] = {}

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            for target in panel.get("targets", []):
                expr = target["expr"].replace("$job", re.escape(job))
                metric = re.search(r"perfmon_\w+", expr)
                out[f"{panel.get('title')}: {metric[0] if metric else expr}"] = expr
            walk(panel.get("panels", []))

    walk(json.loads(DASHBOARD.read_text())["panels"])
    return out


class Prometheus:
    """``prometheus`` scraping ``targets`` (host:port) every second, as job ``perfmon``; labels the
    targets serve win (honor_labels), as the docs tell users to set."""

    def __init__(self, directory: Path, targets: list[str]) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise FileNotFoundError("prometheus")
        self.port = free_port()
        config = directory / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
                          "  - job_name: perfmon\n    honor_labels: true\n    static_configs:\n"
                          f"      - targets: {json.dumps(targets)}\n")
        self.log = (directory / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={directory / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not self._ready():
            assert self.proc.poll() is None, (directory / "prometheus.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "prometheus did not become ready"
            time.sleep(0.2)

    def _ready(self) -> bool:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2).status == 200
        except OSError:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector ``expr`` evaluates to now (``[{metric, value: [t, "v"]}]``)."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        body = json.loads(urllib.request.urlopen(url, timeout=10).read())
        assert body["status"] == "success", body
        return body["data"]["result"]

    def targets_up(self) -> int:
        return sum(float(r["value"][1]) == 1.0 for r in self.query('up{job="perfmon"}'))

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
