"""The fault script of issue 44: a deployment like a team's, with real processes, and every fault it must survive.

    python -m tests.operations.faults [--rounds 2] [--only FAULT ...] [--keep]

Brings up, on loopback, in a temporary folder:
- a Prefect server, the `local-pool` process work pool, the deployments of deployments/prefect.yaml, the zombie-run
  automation of deployments/zombie-runs.yaml, and a process worker (its environment the operator's settings);
- an external dask scheduler and two dask workers, each a process of its own in an empty folder;
- the data, the scratch and the output on an S3 API (moto's server, reached through a forwarder that can refuse
  connections: tests/tcp_proxy.py);
- the privacy ledger on PostgreSQL (tests/postgres.py);
then runs a k-means release through the `release/example-kmeans` deployment for each fault, injects the fault at a
point of the run (a stage's start, a round of the noisy iterations, the manifest appearing in the bucket), recovers as
an operator would (restart what was killed, let the run ride the outage out, rerun the release id through the
deployment, or `dprelease ledger reconcile`), and checks the release, its catalogue row and its ledger row.

The faults, each `--rounds` times (default 2), the rounds at different points or durations:
  worker-kill          kill -9 of the Prefect worker alone: the flow process lives on and finishes; a new worker.
  worker-flow-kill     kill -9 of the worker and its flow process (a host crash): the run stays Running until the
                       zombie-run automation marks it Crashed (no heartbeat for 90 s); a new worker; the release id
                       rerun through the deployment. Round 1 kills during the noisy draw (that attempt's noise is
                       lost with the process: the rerun is charged again), round 2 after the commit (charged once).
  postgres-draw        PostgreSQL stopped during the noisy draw: round 1 restarted within the outage window (the run
                       rides it out), round 2 beyond it (the run fails in one line; restarted, the id rerun).
  postgres-publish     PostgreSQL stopped during publish: round 1 at the publish stage's start, restarted within the
                       window; round 2 as soon as the manifest is in the bucket, beyond the window (public, ledger
                       behind: the id rerun completes the ledger row).
  s3-publish           the S3 endpoint refusing connections during publish: round 1 within the window; round 2
                       beyond it (nothing public; then `dprelease ledger reconcile` copies the committed release).
  dask-worker-lost     one dask worker kill -9'd (with its nanny) during the draw: the other finishes; a new worker.
  scheduler-lost       the dask scheduler kill -9'd: round 1 during the ingest, scheduler and workers restarted within
                       the wait (the stage is retried and the run completes); round 2 during the draw, not restarted
                       within the operator's dask_wait_seconds (the run fails in one line; the id rerun, charged
                       again: noise was drawn).
  scratch-full         the scratch location full (a 64 MiB tmpfs as DPRELEASE_SCRATCH, filled to the last byte):
                       round 1 during the ingest, round 2 while the measurements are committed; space freed, the id
                       rerun. (The scratch of this fault is a local tmpfs, not the S3 bucket: a bucket has no size
                       to fill; the dask workers share this machine's disk.)

Prints one line per trial and then
    RESULT faults=<n> data_lost=<n> charged_twice=<n> ledger_catalogue_disagree=<n> hung=<n>
data_lost: a release that could not be published after recovery, a published file whose sha256 is not its manifest's,
or published measurements other than those committed before the fault (a redraw). charged_twice: releases charged
more than once (the ledger's attempts; expected where a fault killed an attempt that had drawn noise).
ledger_catalogue_disagree: releases whose ledger status, catalogue row and manifest disagree after recovery, plus
what `dprelease ledger reconcile` reports as disagreeing at the end. hung: flow runs not in a final state within
their bound (the outage window, the dask wait, the zombie window, plus the run's own time).
Needs root for the tmpfs of scratch-full (skipped otherwise, and said so).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from tests.operations.conftest import wait_http
from tests.processes import REPO, free_port, python_path, start, stop

PREFECT = [sys.executable, "-m", "prefect"]
DATASET = "fault-points"
T = 24  # noisy rounds: the draw lasts long enough to hit it
OUTAGE_SECONDS = 30  # the operator's outage_retry_seconds for this deployment
DASK_WAIT_SECONDS = 30  # and dask_wait_seconds
ZOMBIE_WINDOW = 90  # deployments/zombie-runs.yaml
FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass
class Trial:
    fault: str
    round: int
    release_id: str
    notes: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    hung: int = 0
    data_lost: bool = False
    disagree: bool = False
    attempts: int = 0
    error: str | None = None
    committed_before: bytes | None = None


class Deployment:
    """Every process of the deployment (see the module docstring), started and stopped here."""

    def __init__(self, root: Path):
        self.root = root
        self.procs: dict[str, subprocess.Popen] = {}
        self.tmpfs: Path | None = None

    # ---- bring-up ----------------------------------------------------------------------------------------------
    def up(self) -> None:
        from moto.server import ThreadedMotoServer

        from tests import postgres as pg
        from tests.tcp_proxy import Proxy

        root = self.root
        log(f"bringing the deployment up in {root}")
        bin_dir = pg.binaries()
        if bin_dir is None:
            raise SystemExit("no PostgreSQL binaries (initdb, pg_ctl): install Debian's postgresql package")
        self.pg = pg.Server.start(bin_dir)
        self.ledger_url = self.pg.new_database()
        self.moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.moto.start()
        self.s3_proxy = Proxy(self.moto.get_host_and_port())
        self.aws = {"AWS_ENDPOINT_URL": self.s3_proxy.url, "AWS_ACCESS_KEY_ID": "test",
                    "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
        os.environ.update(self.aws)  # this process's checks (boto3, s3fs) go through the forwarder too
        import boto3

        host, port = self.moto.get_host_and_port()
        # the checks read the bucket directly, whatever the forwarder lets through
        self.s3 = boto3.client("s3", endpoint_url=f"http://{host}:{port}")
        for bucket in ("data", "private", "public"):
            self.s3.create_bucket(Bucket=bucket)
        self.port = free_port()
        self.dask_port = free_port()
        self.address = f"tcp://127.0.0.1:{self.dask_port}"
        (root / "specs").mkdir()
        self.out = root / "runs"  # the run folders: the flow host's disk
        self.base_env = {**os.environ, **self.aws, "PYTHONPATH": python_path(), "PYTHONUNBUFFERED": "1",
                         "DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                         "DASK_LOGGING__DISTRIBUTED": "warning"}
        for key in [k for k in self.base_env if k.startswith("DPRELEASE_") or k == "PREFECT_API_URL"]:
            self.base_env.pop(key)
        self.prefect_env = {**self.base_env, "PREFECT_HOME": str(root / "prefect-home"),
                            "PREFECT_API_URL": f"http://127.0.0.1:{self.port}/api", "DPRELEASE_REPO": str(REPO),
                            "PREFECT_WORKER_QUERY_SECONDS": "2",
                            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90"}
        self.operator = {"DPRELEASE_LEDGER": self.ledger_url, "DPRELEASE_SCRATCH": "s3://private/scratch",
                         "DPRELEASE_OUTPUT": "s3://public/releases", "DPRELEASE_DASK_ADDRESS": self.address,
                         "DPRELEASE_SPEC_FOLDERS": str(root / "specs"),
                         "DPRELEASE_OUTAGE_RETRY_SECONDS": str(OUTAGE_SECONDS),
                         "DPRELEASE_DASK_WAIT_SECONDS": str(DASK_WAIT_SECONDS),
                         "DPRELEASE_TASK_RETRY_DELAY_SECONDS": "2"}
        self.env = {**self.prefect_env, **self.operator}
        self.procs["server"] = start(PREFECT + ["server", "start", "--host", "127.0.0.1", "--port", str(self.port),
                                                "--analytics-off"], self.prefect_env, root / "server.log")
        self.start_dask()
        wait_http(f"http://127.0.0.1:{self.port}/api/health", 120)
        for args in (["work-pool", "create", "local-pool", "--type", "process"],
                     ["--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml"],
                     ["automation", "create", "--from-file", "deployments/zombie-runs.yaml"]):
            done = subprocess.run(PREFECT + args, env=self.prefect_env, cwd=REPO, capture_output=True, text=True,
                                  timeout=300)
            if done.returncode != 0:
                raise RuntimeError(f"prefect {' '.join(args)}: {done.stdout[-2000:]}{done.stderr[-2000:]}")
        self.deployment_id = self.api("/deployments/name/release/example-kmeans")["id"]
        self.start_worker()
        self._data()
        log("deployment up")

    def _data(self) -> None:
        rng = np.random.default_rng(44)
        centres = np.array([[25.0, 25.0], [75.0, 30.0], [45.0, 75.0]])
        X = np.clip(centres[rng.integers(0, 3, 60_000)] + rng.normal(0, 6, (60_000, 2)), 0, 100)
        body = "x,y\n" + "\n".join(f"{a:.4f},{b:.4f}" for a, b in X) + "\n"
        self.s3.put_object(Bucket="data", Key="points/points.csv", Body=body.encode())
        self.source = "s3://data/points/points.csv"

    def spec(self, release_id: str, **release) -> Path:
        spec = {"dataset": {"id": DATASET, "path": self.source, "header": True,
                            "bounds": {"x": [0, 100], "y": [0, 100]}},
                "release": {"kind": "kmeans", "k": 3, "iterations": T, "epsilon": 0.3, "mcmc_steps": 400_000,
                            **release},
                "output_dir": str(self.out), "evaluate": False}
        path = self.root / "specs" / f"{release_id}.yaml"
        path.write_text(yaml.safe_dump(spec))
        return path

    def budget(self) -> None:
        spec = self.spec("reviewed")
        done = self.cli(["budget", "set", DATASET, "--epsilon", "100", "--delta", "1e-6", "--source", self.source,
                         "--reading-from", str(spec)])
        if done.returncode != 0:
            raise RuntimeError(done.stderr)

    def cli(self, args: list[str], extra: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "flows.cli", *args], env={**self.env, **(extra or {})},
                              cwd=REPO, capture_output=True, text=True, timeout=600)

    def api(self, path: str, body: dict | None = None):
        """Prefect's REST API; a 503 (its SQLite database busy on this loaded machine) is asked again."""
        for attempt in range(20):
            request = urllib.request.Request(f"http://127.0.0.1:{self.port}/api{path}",
                                             data=None if body is None else json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"},
                                             method="GET" if body is None else "POST")
            try:
                with urllib.request.urlopen(request, timeout=60) as r:
                    return json.loads(r.read() or b"null")
            except urllib.error.HTTPError as exc:
                if exc.code < 500 or attempt == 19:
                    raise RuntimeError(f"{path}: HTTP {exc.code} {exc.read()[:500]!r}") from None
                log(f"  Prefect API {path}: HTTP {exc.code}, again")
                time.sleep(min(2 ** attempt, 10))

    # ---- processes ---------------------------------------------------------------------------------------------
    def start_worker(self, extra: dict | None = None) -> None:
        n = sum(1 for k in self.procs if k.startswith("worker-log"))
        self.procs[f"worker-log{n}"] = None  # a counter of worker logs
        self.worker_log = self.root / f"worker-{n}.log"
        self.procs["worker"] = start(PREFECT + ["worker", "start", "--pool", "local-pool"],
                                     {**self.env, **(extra or {})}, self.worker_log)

    def kill_worker(self, with_flow: bool) -> None:
        """kill -9 of the Prefect worker, and with_flow of every process under it too (the flow run processes it
        started, in sessions of their own): a host's crash."""
        proc = self.procs["worker"]
        victims = [proc.pid] + (descendants(proc.pid) if with_flow else [])
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(10)
        proc.reaper.release()

    def start_dask(self) -> None:
        env = {**self.base_env}
        self.procs["scheduler"] = start([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                         "--port", str(self.dask_port), "--dashboard-address", "127.0.0.1:0"],
                                        env, self.root / "scheduler.log", cwd=self.root)
        deadline = time.time() + 60
        from distributed import Client

        while True:
            try:
                Client(self.address, timeout=2).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.5)
        for i in range(2):
            self.start_dask_worker(i)
        self.wait_dask_workers(2)

    def start_dask_worker(self, i: int) -> None:
        home = self.root / f"dask-worker-{i}-{int(time.time() * 1000)}"
        home.mkdir()
        self.procs[f"dask-{i}"] = start(
            [sys.executable, "-m", "distributed.cli.dask_worker", self.address, "--nworkers", "1", "--nthreads", "1",
             "--local-directory", str(home / "tmp"), "--host", "127.0.0.1", "--dashboard-address", "127.0.0.1:0"],
            {**self.base_env, "TMPDIR": str(home)}, home.parent / f"{home.name}.log", cwd=home)

    def wait_dask_workers(self, n: int, timeout: float = 120) -> None:
        from distributed import Client

        deadline = time.time() + timeout
        with Client(self.address, timeout="60s") as client:
            while len(client.scheduler_info()["workers"]) < n:
                if time.time() > deadline:
                    raise TimeoutError(f"{n} dask workers did not join")
                time.sleep(0.5)

    def kill(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        if proc is not None:
            proc.reaper.release()

    def restart_dask(self) -> None:
        for name in ("dask-0", "dask-1", "scheduler"):
            self.kill(name)
        self.start_dask()

    def down(self) -> None:
        for name, proc in list(self.procs.items()):
            if proc is not None:
                stop(proc)
        for closer in (lambda: self.s3_proxy.close(), lambda: self.moto.stop(), lambda: self.pg.stop(),
                       self.unmount):
            try:
                closer()
            except Exception:
                traceback.print_exc()

    # ---- tmpfs for scratch-full --------------------------------------------------------------------------------
    def mount(self) -> Path | None:
        target = self.root / "scratch-tmpfs"
        target.mkdir(exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,mode=0700", "tmpfs", str(target)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            log(f"scratch-full skipped: cannot mount a tmpfs ({done.stderr.strip()})")
            return None
        self.tmpfs = target
        return target

    def unmount(self) -> None:
        if self.tmpfs is not None:
            subprocess.run(["umount", "-l", str(self.tmpfs)], capture_output=True)
            self.tmpfs = None

    # ---- a release through the deployment ----------------------------------------------------------------------
    def run(self, release_id: str) -> str:
        """A flow run of the deployment for the release id (as `prefect deployment run --param ...`)."""
        spec = self.spec(release_id)
        made = self.api(f"/deployments/{self.deployment_id}/create_flow_run",
                        {"parameters": {"spec_file": str(spec), "release_id": release_id, "period": None}})
        return made["id"]

    def state(self, run_id: str) -> dict:
        return self.api(f"/flow_runs/{run_id}")["state"] or {}

    def wait_final(self, run_id: str, timeout: float) -> dict | None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            state = self.state(run_id)
            if state.get("type") in FINAL:
                return state
            time.sleep(2)
        return None

    def run_log(self, release_id: str) -> Path:
        return self.out / ".logs" / f"{release_id}.log"

    def wait_marker(self, release_id: str, marker: str, run_id: str, timeout: float = 600) -> bool:
        """Until the run's log says `marker` (True), or the run ended (False)."""
        path = self.run_log(release_id)
        deadline = time.time() + timeout
        offset = 0
        while time.time() < deadline:
            if path.exists():
                text = path.read_text(errors="replace")
                if marker in text[offset:]:
                    return True
            if self.state(run_id).get("type") in FINAL:
                return False
            time.sleep(0.05)
        raise TimeoutError(f"'{marker}' not logged by {release_id}")

    def public(self, release_id: str) -> str:
        return f"releases/dataset={DATASET}/kind=kmeans/release={release_id}"

    def wait_object(self, bucket: str, key: str, timeout: float = 600) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                self.s3.head_object(Bucket=bucket, Key=key)
                return True
            except Exception:
                time.sleep(0.02)
        return False


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (children, theirs...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def snapshot(dep: "Deployment", trial: "Trial") -> None:
    """The measurements committed so far (read just after the fault): what the published release must hold."""
    trial.committed_before = committed_measurements(dep, trial.release_id)


# ---- checks --------------------------------------------------------------------------------------------------------
def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def committed_measurements(dep: Deployment, release_id: str) -> bytes | None:
    """The committed measurements kept in the scratch (the bucket, or the tmpfs of scratch-full), or None."""
    local = dep.tmpfs / release_id / "measurements" / "trajectory.parquet" if dep.tmpfs else None
    if local is not None and local.exists():
        return local.read_bytes()
    try:
        return dep.s3.get_object(Bucket="private", Key=f"scratch/{release_id}/measurements/trajectory.parquet"
                                 )["Body"].read()
    except Exception:
        return None


def check(dep: Deployment, trial: Trial) -> None:
    """The release after recovery: published, its files its manifest's, its measurements the committed ones, its
    catalogue row and its ledger row agreeing."""
    import io

    import pyarrow.parquet as pq

    from tasks.ledger import PrivacyLedger

    rid = trial.release_id
    prefix = dep.public(rid)
    try:
        manifest = json.loads(dep.s3.get_object(Bucket="public", Key=f"{prefix}/manifest.json")["Body"].read())
    except Exception:
        manifest = None
    ledger = PrivacyLedger(dep.ledger_url)
    row = next((r for r in ledger.releases(DATASET) if r["release_id"] == rid), None)
    trial.attempts = row["attempts"] if row else 0
    try:
        catalogued = dep.s3.get_object(Bucket="public", Key=f"releases/catalogue/release={rid}.parquet")["Body"].read()
        listed = pq.read_table(io.BytesIO(catalogued)).to_pylist()[0]
    except Exception:
        listed = None
    if manifest is None:
        trial.data_lost = True
        trial.notes.append("NOT PUBLISHED after recovery")
    else:
        for name, meta in manifest["files"].items():
            body = dep.s3.get_object(Bucket="public", Key=f"{prefix}/{name}")["Body"].read()
            if _sha(body) != meta["sha256"]:
                trial.data_lost = True
                trial.notes.append(f"{name}: sha256 is not the manifest's")
        published = pq.read_table(io.BytesIO(dep.s3.get_object(
            Bucket="public", Key=f"{prefix}/measurements/trajectory.parquet")["Body"].read()))
        for label, raw in (("committed before the fault", trial.committed_before),
                           ("kept in the scratch", committed_measurements(dep, rid))):
            if raw is not None and not pq.read_table(io.BytesIO(raw)).replace_schema_metadata(None).equals(
                    published.replace_schema_metadata(None)):
                trial.data_lost = True
                trial.notes.append(f"published measurements differ from those {label}: a REDRAW")
    agree = (manifest is not None) == (listed is not None) == (row is not None and row["status"] == "published")
    if listed is not None and manifest is not None and \
            listed["manifest_sha256"] != manifest["manifest_sha256"]["sha256"]:
        agree = False
    if not agree:
        trial.disagree = True
        trial.notes.append(f"disagree: manifest {'yes' if manifest else 'no'}, catalogue "
                           f"{'yes' if listed else 'no'}, ledger {row['status'] if row else 'none'}")


def one_line(dep: Deployment, trial: Trial, state: dict) -> None:
    """A failed run's state message: one line, no traceback."""
    message = state.get("message") or ""
    if "\n" in message.strip() or "Traceback" in message:
        trial.notes.append(f"state message not one line: {message[:200]!r}")
    trial.notes.append(f"failed in one line: {message.strip()[:160]}")


def follow(dep: Deployment, trial: Trial, run_id: str, bound: float) -> dict | None:
    """The run's final state within `bound` seconds, else it counts as hung."""
    trial.runs.append(run_id)
    state = dep.wait_final(run_id, bound)
    if state is None:
        trial.hung += 1
        trial.notes.append(f"HUNG: flow run {run_id} not final after {bound:.0f} s "
                           f"({dep.state(run_id).get('name')})")
    return state


def rerun(dep: Deployment, trial: Trial, bound: float = 900) -> dict | None:
    state = follow(dep, trial, dep.run(trial.release_id), bound)
    if state is not None:
        trial.notes.append(f"rerun: {state.get('type')}")
        if state.get("type") == "FAILED":
            one_line(dep, trial, state)
    return state


RUN_BOUND = 900  # a release's own time on this loaded machine, at most


# ---- the faults ----------------------------------------------------------------------------------------------------
def fault_worker_kill(dep: Deployment, trial: Trial) -> None:
    run_id = dep.run(trial.release_id)
    marker = "DP k-means round 3/" if trial.round == 1 else "stage 'postprocess' started"
    dep.wait_marker(trial.release_id, marker, run_id)
    dep.kill_worker(with_flow=False)
    trial.notes.append(f"worker killed at '{marker}'")
    snapshot(dep, trial)
    time.sleep(3)
    dep.start_worker()
    state = follow(dep, trial, run_id, RUN_BOUND)
    trial.notes.append(f"the orphaned flow run: {state and state.get('type')}")
    if state is None or state.get("type") != "COMPLETED":
        rerun(dep, trial)


def fault_worker_flow_kill(dep: Deployment, trial: Trial) -> None:
    run_id = dep.run(trial.release_id)
    marker = "DP k-means round 3/" if trial.round == 1 else "stage 'postprocess' started"
    dep.wait_marker(trial.release_id, marker, run_id)
    dep.kill_worker(with_flow=True)
    trial.notes.append(f"worker and flow process killed at '{marker}'")
    snapshot(dep, trial)
    t0 = time.time()
    state = follow(dep, trial, run_id, ZOMBIE_WINDOW + 30 + 120)  # the automation's window, a heartbeat, slack
    if state is not None:
        trial.notes.append(f"the killed run became {state.get('type')} after {time.time() - t0:.0f} s")
    dep.start_worker()
    rerun(dep, trial)


def _outage_ridden_or_rerun(dep, trial, run_id, restore, outage: float | None, bound: float) -> None:
    """The outage ends after `outage` seconds (None: only once the run ended); then the run's end, and a rerun if
    it failed."""
    if outage is not None:
        timer = threading.Timer(outage, restore)
        timer.start()
    state = follow(dep, trial, run_id, bound)
    if outage is None:
        restore()
    else:
        timer.join()
    trial.notes.append(f"run: {state and state.get('type')}")
    if state is not None and state.get("type") == "FAILED":
        one_line(dep, trial, state)
    if state is None or state.get("type") != "COMPLETED":
        rerun(dep, trial)


def fault_postgres_draw(dep: Deployment, trial: Trial) -> None:
    run_id = dep.run(trial.release_id)
    dep.wait_marker(trial.release_id, "DP k-means round 3/", run_id)
    dep.pg.halt()
    snapshot(dep, trial)
    outage = 12.0 if trial.round == 1 else None
    trial.notes.append("PostgreSQL stopped during the draw, " + ("back after 12 s" if outage else
                                                                 "back once the run ended"))
    _outage_ridden_or_rerun(dep, trial, run_id, dep.pg.resume, outage, RUN_BOUND)


def fault_postgres_publish(dep: Deployment, trial: Trial) -> None:
    run_id = dep.run(trial.release_id)
    if trial.round == 1:
        dep.wait_marker(trial.release_id, "stage 'publish' started", run_id)
        dep.pg.halt()
        snapshot(dep, trial)
        trial.notes.append("PostgreSQL stopped at the publish stage's start, back after 12 s")
        _outage_ridden_or_rerun(dep, trial, run_id, dep.pg.resume, 12.0, RUN_BOUND)
    else:
        dep.wait_object("public", f"{dep.public(trial.release_id)}/manifest.json")
        dep.pg.halt()
        snapshot(dep, trial)
        trial.notes.append("PostgreSQL stopped when the manifest reached the bucket, back once the run ended")
        _outage_ridden_or_rerun(dep, trial, run_id, dep.pg.resume, None, RUN_BOUND)


def fault_s3_publish(dep: Deployment, trial: Trial) -> None:
    run_id = dep.run(trial.release_id)
    dep.wait_marker(trial.release_id, "stage 'publish' started", run_id)
    dep.s3_proxy.refuse()
    snapshot(dep, trial)
    if trial.round == 1:
        trial.notes.append("S3 refusing connections from the publish stage's start, for 20 s")
        _outage_ridden_or_rerun(dep, trial, run_id, dep.s3_proxy.accept, 20.0, RUN_BOUND)
        return
    trial.notes.append("S3 refusing connections from the publish stage's start until the run ended")
    trial.runs.append(run_id)
    state = dep.wait_final(run_id, RUN_BOUND)
    dep.s3_proxy.accept()
    if state is None:
        trial.hung += 1
        return
    trial.notes.append(f"run: {state.get('type')}")
    if state.get("type") == "FAILED":
        one_line(dep, trial, state)
    done = dep.cli(["ledger", "reconcile", "--output-dir", str(dep.out)])
    trial.notes.append("reconcile: " + " | ".join(line.strip() for line in done.stdout.splitlines()[-2:]))


def fault_dask_worker_lost(dep: Deployment, trial: Trial) -> None:
    run_id = dep.run(trial.release_id)
    marker = "DP k-means round 3/" if trial.round == 1 else "partitions normalised"
    dep.wait_marker(trial.release_id, marker, run_id)
    victim = f"dask-{trial.round - 1}"
    dep.kill(victim)
    trial.notes.append(f"dask worker {victim} killed at '{marker}'")
    snapshot(dep, trial)
    state = follow(dep, trial, run_id, RUN_BOUND)
    trial.notes.append(f"run: {state and state.get('type')}")
    dep.start_dask_worker(trial.round - 1)
    dep.wait_dask_workers(2)
    if state is None or state.get("type") != "COMPLETED":
        if state is not None and state.get("type") == "FAILED":
            one_line(dep, trial, state)
        rerun(dep, trial)


def fault_scheduler_lost(dep: Deployment, trial: Trial) -> None:
    run_id = dep.run(trial.release_id)
    if trial.round == 1:
        dep.wait_marker(trial.release_id, "stage 'ingest' started", run_id)
        time.sleep(1.0)
        dep.kill("scheduler")
        snapshot(dep, trial)
        trial.notes.append("dask scheduler killed during the ingest; scheduler and workers restarted after 5 s")
        time.sleep(5)
        dep.restart_dask()
        state = follow(dep, trial, run_id, RUN_BOUND)
    else:
        dep.wait_marker(trial.release_id, "DP k-means round 3/", run_id)
        dep.kill("scheduler")
        snapshot(dep, trial)
        trial.notes.append("dask scheduler killed during the draw; restarted once the run ended")
        t0 = time.time()
        state = follow(dep, trial, run_id, DASK_WAIT_SECONDS + RUN_BOUND)
        trial.notes.append(f"the run ended {time.time() - t0:.0f} s after the kill")
        dep.restart_dask()
    trial.notes.append(f"run: {state and state.get('type')}")
    if state is not None and state.get("type") == "FAILED":
        one_line(dep, trial, state)
    if state is None or state.get("type") != "COMPLETED":
        rerun(dep, trial)


def fault_scratch_full(dep: Deployment, trial: Trial) -> None:
    if dep.tmpfs is None and dep.mount() is None:
        trial.notes.append("SKIPPED: no tmpfs")
        trial.error = "skipped"
        return
    scratch = dep.tmpfs
    dep.kill_worker(with_flow=True)  # a worker whose scratch is the small local disk
    dep.start_worker({"DPRELEASE_SCRATCH": str(scratch)})
    try:
        run_id = dep.run(trial.release_id)
        marker = "stage 'ingest' started" if trial.round == 1 else "stage 'dp measurement' started"
        dep.wait_marker(trial.release_id, marker, run_id)
        filler = scratch / "filler"
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=1M", "count=100"], capture_output=True)
        snapshot(dep, trial)
        trial.notes.append(f"scratch filled at '{marker}' ({shutil.disk_usage(scratch).free} bytes left)")
        state = follow(dep, trial, run_id, RUN_BOUND)
        filler.unlink()
        trial.notes.append(f"run: {state and state.get('type')}")
        if state is not None and state.get("type") == "FAILED":
            one_line(dep, trial, state)
        if state is None or state.get("type") != "COMPLETED":
            rerun(dep, trial)
    finally:
        dep.kill_worker(with_flow=True)
        dep.start_worker()


FAULTS = {"worker-kill": fault_worker_kill, "worker-flow-kill": fault_worker_flow_kill,
          "postgres-draw": fault_postgres_draw, "postgres-publish": fault_postgres_publish,
          "s3-publish": fault_s3_publish, "dask-worker-lost": fault_dask_worker_lost,
          "scheduler-lost": fault_scheduler_lost, "scratch-full": fault_scratch_full}


def _healthy(dep: Deployment) -> None:
    """Between trials: the services up (a trial that failed half-way may have left one down)."""
    dep.s3_proxy.accept()
    if dep.pg.pid is None:
        dep.pg.resume()
    if dep.procs["worker"].poll() is not None:
        dep.start_worker()
    try:
        dep.wait_dask_workers(2, timeout=20)
    except Exception:
        dep.restart_dask()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", nargs="+", choices=sorted(FAULTS), default=list(FAULTS))
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server logs every request
    root = Path(tempfile.mkdtemp(prefix="dprelease-faults-"))
    dep = Deployment(root)
    trials: list[Trial] = []
    t_start = time.time()
    try:
        dep.up()
        dep.budget()
        for name in args.only:
            for r in range(1, args.rounds + 1):
                trial = Trial(name, r, f"f-{name}-{r}")
                trials.append(trial)
                _healthy(dep)
                log(f"fault {name} round {r}: release {trial.release_id}")
                t0 = time.time()
                try:
                    FAULTS[name](dep, trial)
                except Exception as exc:
                    trial.error = f"{type(exc).__name__}: {exc}"
                    traceback.print_exc()
                if trial.error != "skipped":
                    _healthy(dep)
                    check(dep, trial)
                log(f"  {name} #{r}: {time.time() - t0:.0f} s; attempts {trial.attempts}; "
                    + "; ".join(trial.notes) + (f"; ERROR {trial.error}" if trial.error else ""))
        done = dep.cli(["ledger", "reconcile", "--dry-run", "--json", "--output-dir", str(dep.out)])
        final = json.loads(done.stdout)["counts"] if done.stdout.strip().startswith("{") else {"disagrees": -1}
        log(f"reconcile at the end (dry run): {final}")
        stuck = [r for r in dep.api("/flow_runs/filter", {"flow_runs": {"state": {"type": {"any_": [
            "RUNNING", "PENDING", "CANCELLING"]}}}}) or []]  # (the deployments' cron schedules' runs are SCHEDULED)
    finally:
        if "final" not in locals():
            final, stuck = {"disagrees": -1}, []
        dep.down()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            log(f"kept {root}")
    ran = [t for t in trials if t.error != "skipped"]
    result = {"faults": len(ran), "data_lost": sum(t.data_lost for t in ran),
              "charged_twice": sum(t.attempts > 1 for t in ran),
              "ledger_catalogue_disagree": sum(t.disagree for t in ran) + max(final.get("disagrees", 0), 0)
              + (1 if final.get("disagrees", 0) < 0 else 0),
              "hung": sum(t.hung for t in ran) + len(stuck)}
    log(f"{len(ran)} faults in {time.time() - t_start:.0f} s; runs still not final at the end: {len(stuck)}")
    for t in trials:
        log(f"  {t.fault} #{t.round} {t.release_id}: attempts {t.attempts}, data_lost {t.data_lost}, "
            f"disagree {t.disagree}, hung {t.hung}{', ERROR ' + t.error if t.error else ''}")
    print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()), flush=True)
    return 0 if result["data_lost"] == result["ledger_catalogue_disagree"] == result["hung"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
