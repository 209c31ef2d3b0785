"""Make docs/prefect-artifacts.png (the Prefect UI's flow-run page of a real release, Artifacts tab),
docs/prefect-report-artifact.png (the release report artifact) and docs/prefect-upcoming-runs.png (the example
deployment's upcoming scheduled runs, tagged with their dataset and kind before they start).

    python docs/ui_screenshot.py [--out docs/prefect-artifacts.png] [--report-out docs/prefect-report-artifact.png]
        [--upcoming-out docs/prefect-upcoming-runs.png]

Starts a Prefect server on loopback (temporary PREFECT_HOME), runs the built-in example release against it
with the CLI (its own ledger, under a temporary folder), then drives headless Chromium (`apt install
chromium`) over the DevTools protocol (the `websockets` client Prefect already installs). Everything is
stopped and removed afterwards.
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


def _report_id(api: str, run_id: str) -> str:
    body = json.dumps({"artifacts": {"flow_run_id": {"any_": [run_id]},
                                     "key": {"any_": ["release-report-example-sensors"]}}}).encode()
    request = urllib.request.Request(f"{api}/artifacts/filter", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as r:
        return json.loads(r.read())[0]["id"]


def _deploy_example(env: dict) -> None:
    """The example deployment (deployments/prefect.yaml), whose schedule the server turns into upcoming runs."""
    for args in (["work-pool", "create", "local-pool", "--type", "process"],
                 ["--no-prompt", "deploy", "--name", "example-kmeans", "--prefect-file", "deployments/prefect.yaml"]):
        subprocess.run([sys.executable, "-m", "prefect", *args], env={**env, "DPRELEASE_REPO": str(REPO)}, cwd=REPO,
                       check=True, stdout=subprocess.DEVNULL)
    time.sleep(15)  # the scheduler's loop


def capture(browser: str, url: str, out: str, click: str | None = None, width: int = 1500,
            height: int = 1300) -> None:
    """Open `url` in headless Chromium over the DevTools protocol, click the tab labelled `click` (the UI is
    a single-page app: its tabs are not in the URL), and save a PNG."""
    import base64

    from websockets.sync.client import connect

    port = _port()
    chrome = subprocess.Popen([browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                               f"--remote-debugging-port={port}", f"--window-size={width},{height}", "about:blank"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(f"http://127.0.0.1:{port}/json/version", 60)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as r:
            target = next(t for t in json.loads(r.read()) if t["type"] == "page")
        with connect(target["webSocketDebuggerUrl"], max_size=None) as ws:
            ids = iter(range(1, 1000))

            def call(method: str, **params):
                i = next(ids)
                ws.send(json.dumps({"id": i, "method": method, "params": params}))
                while True:
                    message = json.loads(ws.recv())
                    if message.get("id") == i:
                        return message.get("result", {})
            call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
            call("Page.navigate", url=url)
            time.sleep(10)
            if click:
                call("Runtime.evaluate", expression=(
                    "[...document.querySelectorAll('button,a,[role=tab],li,span')]"
                    f".find(e => e.textContent.trim() === {json.dumps(click)})?.click()"))
                time.sleep(5)
            Path(out).write_bytes(base64.b64decode(call("Page.captureScreenshot", format="png")["data"]))
    finally:
        chrome.terminate()
        chrome.wait(20)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(REPO / "docs" / "prefect-artifacts.png"))
    parser.add_argument("--report-out", default=str(REPO / "docs" / "prefect-report-artifact.png"))
    parser.add_argument("--upcoming-out", default=str(REPO / "docs" / "prefect-upcoming-runs.png"))
    args = parser.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        sys.exit("error: no headless Chromium found (apt install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        port = _port()
        api = f"http://127.0.0.1:{port}/api"
        env = {**os.environ, "PREFECT_HOME": f"{tmp}/home", "PREFECT_API_URL": api,
               "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1",
               "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "5"}
        server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                                   str(port), "--analytics-off"], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            _wait(f"{api}/health")
            subprocess.run([sys.executable, "-m", "flows.cli", "run", "--example", "--release-id", "example-ui",
                            "--output-dir", f"{tmp}/runs"], env=env, cwd=REPO, check=True)
            run_id = _flow_run_id(api, "example-ui")
            ui = f"http://127.0.0.1:{port}"
            capture(browser, f"{ui}/runs/flow-run/{run_id}", args.out, click="Artifacts")
            capture(browser, f"{ui}/artifacts/artifact/{_report_id(api, run_id)}", args.report_out)
            _deploy_example(env)
            with urllib.request.urlopen(f"{api}/deployments/name/release/example-kmeans") as r:
                deployment = json.loads(r.read())["id"]
            capture(browser, f"{ui}/deployments/deployment/{deployment}", args.upcoming_out, click="Upcoming",
                    height=900)
        finally:
            server.terminate()
            server.wait(20)


if __name__ == "__main__":
    main()
