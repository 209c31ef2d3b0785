"""Make docs/prefect-artifacts.png (the Prefect UI's flow-run page of a real release, Artifacts tab) and
docs/prefect-report-artifact.png (the release report artifact of the dataset, with its history).

    python docs/ui_screenshot.py [--out docs/prefect-artifacts.png] [--report-out docs/prefect-report-artifact.png]

Starts a Prefect server on loopback (temporary PREFECT_HOME), runs the built-in example release against it
with the CLI (its own ledger, under a temporary folder), then opens the flow run's Artifacts tab in headless
Chromium (`apt install chromium`) and saves a screenshot. Everything is stopped and removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(url)


def _flow_run_id(api: str, release_id: str) -> str:
    body = json.dumps({"flow_runs": {"name": {"any_": [release_id]}}}).encode()
    request = urllib.request.Request(f"{api}/flow_runs/filter", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as r:
        return json.loads(r.read())[0]["id"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(REPO / "docs" / "prefect-artifacts.png"))
    parser.add_argument("--report-out", default=str(REPO / "docs" / "prefect-report-artifact.png"))
    args = parser.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        sys.exit("error: no headless Chromium found (apt install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        port = _port()
        api = f"http://127.0.0.1:{port}/api"
        env = {**os.environ, "PREFECT_HOME": f"{tmp}/home", "PREFECT_API_URL": api,
               "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}
        server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                                   str(port), "--analytics-off"], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            _wait(f"{api}/health")
            subprocess.run([sys.executable, "-m", "flows.cli", "run", "--example", "--release-id", "example-ui",
                            "--output-dir", f"{tmp}/runs"], env=env, cwd=REPO, check=True)
            run_id = _flow_run_id(api, "example-ui")
            ui = f"http://127.0.0.1:{port}"
            for out, page in ((args.out, f"{ui}/runs/flow-run/{run_id}?tab=artifacts"),
                              (args.report_out, f"{ui}/artifacts/key/release-report-example-sensors")):
                subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                                "--window-size=1500,1300", "--virtual-time-budget=20000", f"--screenshot={out}", page],
                               check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                print(f"wrote {out}")
        finally:
            server.terminate()
            server.wait(20)


if __name__ == "__main__":
    main()
