"""Faults a release survives (issue 44): the ledger, the catalogue and the release agreeing after any fault; outages of
the ledger's database and of an object store ridden out with backoff, then one line; a dask cluster lost or left
without workers failing in one line after a bounded wait; the raw-derived scratch removed once published, and never
inside the public output location; the data read pinned to the version the checks took.

Real servers throughout (PostgreSQL, moto's S3 server behind a TCP forwarder that refuses connections on demand, a
`dask scheduler` process); tests/operations/faults.py injects the same faults into a whole deployment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from tasks.errors import InputError, ReleaseError
from tasks.ledger import PrivacyLedger
from tasks.transient import Unavailable, connection_error, retried, riding_out
from tests.conftest import ledger, write_csv

OUTAGE_ENV = "DPRELEASE_OUTAGE_RETRY_SECONDS"


# ---- the backoff ---------------------------------------------------------------------------------------------------
def test_an_outage_is_ridden_out_with_backoff_then_is_one_line(monkeypatch):
    monkeypatch.setenv(OUTAGE_ENV, "20")
    calls: list[float] = []

    def flaky():
        calls.append(time.monotonic())
        if len(calls) < 4:
            raise ConnectionRefusedError(111, "Connection refused")
        return "done"

    with riding_out():
        assert retried(flaky, "the object store s3://b", connection_error) == "done"
    gaps = np.diff(calls)
    assert len(calls) == 4 and all(later > 1.5 * earlier for earlier, later in zip(gaps, gaps[1:])), gaps

    calls.clear()  # outside a release's run (its checks, an operator's command): at once
    with pytest.raises(ConnectionRefusedError):
        retried(flaky, "the object store s3://b", connection_error)
    assert len(calls) == 1

    monkeypatch.setenv(OUTAGE_ENV, "1.5")
    calls.clear()
    with riding_out(), pytest.raises(Unavailable) as refused:
        retried(lambda: flaky() and flaky() and flaky() and flaky() and 1 / 0, "the object store s3://b",
                connection_error)
    message = str(refused.value)
    assert message.startswith("the object store s3://b could not be reached for 1.5 s (ConnectionRefusedError")
    assert "\n" not in message and "rerun its release id" in message

    with riding_out(), pytest.raises(ValueError):  # not an outage: at once
        retried(lambda: int("x"), "the object store s3://b", connection_error)


def test_an_object_stores_connection_errors_are_outages_and_its_refusals_are_not():
    import botocore.exceptions as bx

    assert connection_error(bx.EndpointConnectionError(endpoint_url="http://127.0.0.1:1"))
    assert connection_error(bx.ConnectionClosedError(endpoint_url="http://127.0.0.1:1"))
    wrapped = OSError("wrapped")
    wrapped.__cause__ = bx.ReadTimeoutError(endpoint_url="http://127.0.0.1:1")
    assert connection_error(wrapped)
    assert not connection_error(FileNotFoundError(2, "No such key"))
    assert not connection_error(PermissionError(13, "Access denied"))


# ---- the ledger's database going away --------------------------------------------------------------------------------
def test_the_ledger_rides_out_a_postgresql_restart_and_says_so_in_one_line_when_it_stays_down(postgres, monkeypatch):
    """A restart of the shared ledger's server under a running release delays it; a server that stays away is one
    line naming the ledger, its password masked, after the operator's window; outside a run, at once."""
    from dpalgos import dpkmeans

    url = postgres.new_database().replace("dprelease@", "dprelease:s3cret@")
    ledger_ = PrivacyLedger(url)
    ledger_.set_budget("d", 10.0, 1e-6)
    ledger_.charge(dataset_id="d", release_id="r", kind="kmeans", fingerprint="f", redraw=True, owner="A",
                   plan=dpkmeans.plan(epsilon=0.5, iterations=5), location="/runs/a")
    monkeypatch.setenv(OUTAGE_ENV, "60")
    postgres.halt()
    timer = threading.Timer(3.0, postgres.resume)
    timer.start()
    try:
        t0 = time.monotonic()
        with riding_out():
            ledger_.begin_draw("r", "A")
            ledger_.begin_draw("r", "A")  # repeated by the same run (a commit whose answer was lost): unchanged
        assert time.monotonic() - t0 >= 2.5
    finally:
        timer.join()
    assert [(r["status"], r["attempts"]) for r in ledger_.releases("d")] == [("drawing", 1)]

    monkeypatch.setenv(OUTAGE_ENV, "2")
    postgres.halt()
    try:
        with riding_out(), pytest.raises(Unavailable) as down:
            ledger_.mark("r", "measured")
        with pytest.raises(ReleaseError) as at_once:  # an operator's command: no window
            PrivacyLedger(url).releases("d")
    finally:
        postgres.resume()
    for message in (str(down.value), str(at_once.value)):
        assert "\n" not in message and "s3cret" not in message and "dprelease:***@" in message
    assert str(down.value).startswith("the privacy ledger postgresql://dprelease:***@") and "for 2 s" in str(down.value)
    assert ledger_.status("r") == "drawing"


# ---- releases on an S3 API whose endpoint refuses connections ------------------------------------------------------
moto_server = pytest.importorskip("moto.server", reason="moto[server] (the test extra) runs the S3 API")


@pytest.fixture(scope="module")
def s3_endpoint():
    """moto's S3 server, reached through a forwarder that can refuse connections (tests/tcp_proxy.py)."""
    from tests.tcp_proxy import Proxy

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    proxy = Proxy(server.get_host_and_port())
    yield proxy
    proxy.close()
    server.stop()


@pytest.fixture
def s3(s3_endpoint, monkeypatch):
    import boto3
    import s3fs

    for key, value in {"AWS_ENDPOINT_URL": s3_endpoint.url, "AWS_ACCESS_KEY_ID": "test",
                       "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    # s3fs caches one filesystem per constructor arguments, with the endpoint it read from the environment then:
    # another module's server (another port) would otherwise be asked.
    s3fs.S3FileSystem.clear_instance_cache()
    client = boto3.client("s3")
    for bucket in ("data", "private", "public"):
        if bucket in {b["Name"] for b in client.list_buckets()["Buckets"]}:
            for o in client.list_objects_v2(Bucket=bucket).get("Contents", []):
                client.delete_object(Bucket=bucket, Key=o["Key"])
        else:
            client.create_bucket(Bucket=bucket)
    return client


def _values(tmp_path: Path, n: int = 1500, seed: int = 0) -> Path:
    return write_csv(tmp_path / "values.csv", np.random.default_rng(seed).uniform(0, 100, (n, 1)), header=("x",))


def _histogram(data, tmp_path: Path, release_id: str, **extra) -> dict:
    return {"dataset": {"id": "sensors", "path": str(data), "header": True, "bounds": {"x": [0, 100]}},
            "release": {"kind": "histogram", "bins": 16, "branching": 4, "epsilon": 0.5},
            "output_dir": str(tmp_path / "runs"), "evaluate": False, "release_id": release_id,
            "dask": {"n_workers": 1, "threads_per_worker": 1}, **extra}


def _cli(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})}, cwd=Path(__file__).resolve().parents[1])


def _refuse_during_publish(monkeypatch, proxy, back_after: float | None):
    """The S3 endpoint refuses connections from the moment the publish step copies the release (`copy_public`),
    and accepts them again `back_after` seconds later (None: when the test says so)."""
    import tasks.manifest

    original = tasks.manifest.copy_public

    def copy(release, public):
        proxy.refuse()
        if back_after is not None:
            threading.Timer(back_after, proxy.accept).start()
        return original(release, public)
    monkeypatch.setattr(tasks.manifest, "copy_public", copy)


@pytest.mark.usefixtures("prefect_api")
def test_an_object_store_outage_during_publish_is_ridden_out(s3, s3_endpoint, tmp_path, monkeypatch):
    from flows.release import release
    from tasks.storage import catalogue

    monkeypatch.setenv("DPRELEASE_SCRATCH", "s3://private/scratch")
    monkeypatch.setenv("DPRELEASE_OUTPUT", "s3://public/releases")
    monkeypatch.setenv(OUTAGE_ENV, "90")
    data = _values(tmp_path)
    ledger().set_budget("sensors", 5.0, 0.0, source=str(data))
    _refuse_during_publish(monkeypatch, s3_endpoint, back_after=20.0)
    summary = release(spec=_histogram(data, tmp_path, "outage-1"))
    assert summary["status"] == "published"
    [row] = catalogue.rows("s3://public/releases")
    assert row["release_id"] == "outage-1"
    assert [(r["status"], r["attempts"]) for r in ledger().releases("sensors")] == [("published", 1)]
    log = (tmp_path / "runs" / ".logs" / "outage-1.log").read_text()
    assert "could not be reached (EndpointConnectionError): try 1" in log


@pytest.mark.usefixtures("prefect_api")
def test_an_object_store_that_stays_away_during_publish_fails_in_one_line_and_reconcile_completes_it(
        s3, s3_endpoint, tmp_path, monkeypatch):
    """The run fails with one line after the window; nothing is public and the ledger says `measured`. Once the store
    is back, `dprelease ledger reconcile` copies the committed release from the run folder, catalogues it and marks
    it published (printing each change); a second reconcile changes nothing; a rerun of the id is `already
    published`, charged once."""
    from flows.release import release
    from tasks.storage import catalogue

    env = {"DPRELEASE_SCRATCH": "s3://private/scratch", "DPRELEASE_OUTPUT": "s3://public/releases"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(OUTAGE_ENV, "2")
    data = _values(tmp_path)
    ledger().set_budget("sensors", 5.0, 0.0, source=str(data))
    _refuse_during_publish(monkeypatch, s3_endpoint, back_after=None)
    try:
        with pytest.raises(Unavailable, match=r"^the object store s3://public could not be reached for 2 s"):
            release(spec=_histogram(data, tmp_path, "outage-2"))
    finally:
        s3_endpoint.accept()
    assert ledger().status("outage-2") == "measured"
    assert not [k for k in s3.list_objects_v2(Bucket="public").get("Contents", []) if "manifest" in k["Key"]]

    pending = _cli("ledger", "reconcile")  # drawn in the scratch store: its run folder is not the ledger's to name
    assert pending.returncode == 0 and "1 pending" in pending.stdout, pending.stdout + pending.stderr
    runs = ["--output-dir", str(tmp_path / "runs")]
    dry = _cli("ledger", "reconcile", "--dry-run", *runs)
    assert dry.returncode == 0, dry.stderr
    assert "would be copied from" in dry.stdout
    assert "would be marked published in the ledger (was measured)" in dry.stdout
    assert ledger().status("outage-2") == "measured"
    done = _cli("ledger", "reconcile", *runs)
    assert done.returncode == 0, done.stderr
    assert "repaired" in done.stdout and "marked published in the ledger (was measured)" in done.stdout
    assert "1 swept" in done.stdout  # its raw-derived scratch, now that it is published
    assert ledger().status("outage-2") == "published"
    [row] = catalogue.rows("s3://public/releases")
    assert row["release_id"] == "outage-2"
    again = _cli("ledger", "reconcile", "--json", *runs)
    assert json.loads(again.stdout)["counts"] == {"agrees": 1, "repaired": 0, "pending": 0, "disagrees": 0,
                                                   "swept": 0}

    monkeypatch.setattr("tasks.manifest.copy_public", lambda *a: pytest.fail("copied again"))
    assert release(spec=_histogram(data, tmp_path, "outage-2"))["status"] == "already published"
    assert [(r["status"], r["attempts"]) for r in ledger().releases("sensors")] == [("published", 1)]


@pytest.mark.usefixtures("prefect_api")
def test_a_rerun_that_finds_its_release_published_completes_the_ledger_and_the_catalogue(tmp_path, monkeypatch):
    """The issue's case: a release public (manifest and catalogue row) whose ledger row a fault left `measured`. The
    rerun of its id completes the row (it skipped the ledger's step before); reconcile finds everything agreeing, then
    reports what it cannot settle (a manifest gone) and exits 1."""
    from flows.release import release
    from tasks.storage import catalogue

    monkeypatch.setenv("DPRELEASE_OUTPUT", str(tmp_path / "public"))
    data = _values(tmp_path)
    ledger().set_budget("sensors", 5.0, 0.0, source=str(data))
    spec = _histogram(data, tmp_path, "complete-1")
    release(spec=spec)
    ledger().mark("complete-1", "measured")  # the state the issue found after PostgreSQL stopped during publish
    (tmp_path / "public" / "catalogue" / "release=complete-1.parquet").unlink()
    assert release(spec=spec)["status"] == "already published"
    assert ledger().status("complete-1") == "published"
    assert [r["release_id"] for r in catalogue.rows(str(tmp_path / "public"))] == ["complete-1"]

    agree = _cli("ledger", "reconcile")
    assert agree.returncode == 0 and "1 agrees" in agree.stdout, agree.stdout + agree.stderr
    (tmp_path / "public" / "dataset=sensors" / "kind=histogram" / "release=complete-1" / "manifest.json").unlink()
    shutil_rm = __import__("shutil").rmtree
    shutil_rm(tmp_path / "runs" / "complete-1" / "release")
    disagree = _cli("ledger", "reconcile")
    assert disagree.returncode == 1 and disagree.stderr.count("\n") == 1 and "disagree" in disagree.stderr
    assert "published in the ledger, but" in disagree.stdout and "holds no manifest" in disagree.stdout


@pytest.mark.usefixtures("prefect_api")
def test_a_release_public_from_another_host_is_completed_not_published_twice(tmp_path, monkeypatch):
    """A run folder lost (or a rerun on another host) while the release is public: the rerun adopts the public release
    (no second manifest beside the public files) and completes the ledger."""
    import shutil

    from flows.release import release

    monkeypatch.setenv("DPRELEASE_OUTPUT", str(tmp_path / "public"))
    monkeypatch.setenv("DPRELEASE_SCRATCH", str(tmp_path / "scratch"))
    data = _values(tmp_path)
    ledger().set_budget("sensors", 5.0, 0.0, source=str(data))
    spec = _histogram(data, tmp_path, "adopt-1")
    release(spec=spec)
    public = tmp_path / "public" / "dataset=sensors" / "kind=histogram" / "release=adopt-1" / "manifest.json"
    before = public.read_bytes()
    ledger().mark("adopt-1", "measured")
    shutil.rmtree(tmp_path / "runs")
    assert release(spec=spec)["status"] == "already published"
    assert public.read_bytes() == before
    assert (tmp_path / "runs" / "adopt-1" / "release" / "manifest.json").read_bytes() == before
    assert ledger().status("adopt-1") == "published"


# ---- the scratch: removed once published, never inside the output ------------------------------------------------
@pytest.mark.usefixtures("prefect_api")
def test_the_raw_derived_scratch_is_removed_once_published_unless_the_operator_keeps_it(tmp_path, monkeypatch):
    from datetime import datetime, timedelta, timezone

    from flows.release import release
    from tasks.reconcile import sweep

    scratch = tmp_path / "scratch"
    monkeypatch.setenv("DPRELEASE_SCRATCH", str(scratch))
    data = _values(tmp_path)
    ledger().set_budget("sensors", 5.0, 0.0, source=str(data))
    release(spec=_histogram(data, tmp_path, "scratch-1"))
    assert sorted(p.name for p in (scratch / "scratch-1").iterdir()) == ["measurements"]
    assert not (tmp_path / "runs" / "scratch-1" / "internal" / "stages").exists()

    monkeypatch.setenv("DPRELEASE_SCRATCH_KEEP_DAYS", "2")
    release(spec=_histogram(data, tmp_path, "scratch-2"))
    assert sorted(p.name for p in (scratch / "scratch-2").iterdir()) == ["encoded", "ingested", "measurements"]
    assert sweep(ledger(), now=datetime.now(timezone.utc) + timedelta(days=1)) == []
    [swept] = sweep(ledger(), now=datetime.now(timezone.utc) + timedelta(days=3))
    assert swept.release_id == "scratch-2" and swept.state == "swept"
    assert sorted(p.name for p in (scratch / "scratch-2").iterdir()) == ["measurements"]


@pytest.mark.parametrize("scratch, output", [("public/scratch", "public"), ("private", "private/releases")])
def test_a_scratch_inside_the_public_output_or_around_it_is_refused_before_anything_runs(tmp_path, scratch, output):
    data = _values(tmp_path)
    ledger().set_budget("sensors", 5.0, 0.0, source=str(data))
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(_histogram(data, tmp_path, "placed")))
    env = {"DPRELEASE_SCRATCH": str(tmp_path / scratch), "DPRELEASE_OUTPUT": str(tmp_path / output)}
    for command in (["spec", "check"], ["run"]):
        out = _cli(*command, str(tmp_path / "spec.yaml"), env=env)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
        assert "scratch location" in out.stderr and "Nothing was run" in out.stderr
    assert ledger().releases("sensors") == [] and not (tmp_path / "runs").exists()
    # without an output setting, the spec's output_dir is the public location
    out = _cli("run", str(tmp_path / "spec.yaml"), env={"DPRELEASE_SCRATCH": str(tmp_path / "runs" / "scratch")})
    assert out.returncode == 2 and "is inside the output folder" in out.stderr, out.stderr


@pytest.mark.parametrize("gx, output", [("public/gx", "public"), ("private", "private/releases")])
def test_a_contracts_project_inside_the_public_output_or_around_it_is_refused(tmp_path, gx, output):
    """The great-expectations project holds raw-derived counts (validation results, Data Docs): never published."""
    data = _values(tmp_path)
    ledger().set_budget("sensors", 5.0, 0.0, source=str(data))
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(_histogram(data, tmp_path, "placed")))
    env = {"DPRELEASE_GX_FOLDER": str(tmp_path / gx), "DPRELEASE_OUTPUT": str(tmp_path / output)}
    out = _cli("spec", "check", str(tmp_path / "spec.yaml"), env=env)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert "gx_folder location" in out.stderr and "Nothing was run" in out.stderr
    assert ledger().releases("sensors") == []


# ---- the data read is the version the checks took ----------------------------------------------------------------
@pytest.mark.usefixtures("prefect_api")
def test_data_replaced_while_it_is_read_is_refused_and_nothing_is_charged(tmp_path, monkeypatch):
    import tasks.ingest
    from flows.release import release

    data = _values(tmp_path)
    ledger().set_budget("sensors", 5.0, 0.0, source=str(data))
    reading = tasks.ingest.ingest_dataset

    def read_then_replace(*args, **kwargs):
        output = reading(*args, **kwargs)
        data.write_text(data.read_text() + "50.0\n")  # another version of the file, mid-read
        return output
    monkeypatch.setattr(tasks.ingest, "ingest_dataset", read_then_replace)
    with pytest.raises(InputError, match="changed while it was read"):
        release(spec=_histogram(data, tmp_path, "pinned"))
    assert ledger().releases("sensors") == []
    assert not list(tmp_path.glob("runs/pinned/internal/ingested"))


# ---- a dask cluster without workers --------------------------------------------------------------------------------
@pytest.mark.usefixtures("prefect_api")
def test_a_scheduler_without_workers_fails_in_one_line_after_the_bounded_wait(tmp_path, monkeypatch):
    """Before: a stage waited for workers up to the task timeout (4 hours), saying nothing."""
    from flows.release import release
    from tasks.cluster import ClusterLost
    from tests.processes import free_port, start, stop, wait_for_scheduler

    port = free_port()
    scheduler = start([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port",
                       str(port), "--dashboard-address", "127.0.0.1:0"], os.environ.copy(), tmp_path / "scheduler.log",
                      cwd=tmp_path)
    try:
        wait_for_scheduler(f"tcp://127.0.0.1:{port}")
        monkeypatch.setenv("DPRELEASE_DASK_ADDRESS", f"tcp://127.0.0.1:{port}")
        monkeypatch.setenv("DPRELEASE_DASK_WAIT_SECONDS", "6")
        data = _values(tmp_path)
        ledger().set_budget("sensors", 5.0, 0.0, source=str(data))
        t0 = time.monotonic()
        with pytest.raises(ClusterLost) as lost:
            release(spec=_histogram(data, tmp_path, "no-workers"))
        seconds = time.monotonic() - t0
    finally:
        stop(scheduler)
    message = str(lost.value)
    assert message.startswith("no dask worker is connected to the operator's dask scheduler (DPRELEASE_DASK_ADDRESS) "
                              "for 6 s") and "\n" not in message and f"{port}" not in message
    assert seconds < 60
    assert ledger().releases("sensors") == []  # it was lost in the ingest: nothing charged


# ---- a console whose reader is gone --------------------------------------------------------------------------------
def test_a_run_whose_console_reader_is_gone_runs_on_and_logs_to_its_file(tmp_path):
    """A Prefect worker killed alone closes the pipe its flow runs' consoles write to. Before, rich (under Prefect's
    console handler) ended the flow process with SystemExit at its next log line: the run Crashed, in its noisy draw
    charged again on the rerun (tests/operations/faults.py, worker-kill). A CLI whose terminal went away too."""
    import textwrap

    script = textwrap.dedent("""
        import logging, sys
        from pathlib import Path
        from flows.environment import apply_defaults
        apply_defaults()
        from flows.logs import run_logging

        log = logging.getLogger("dprelease")
        with run_logging(Path(sys.argv[1])):
            log.warning("ready")
            sys.stdin.readline()  # the reader of stdout and stderr is gone now
            for i in range(3):
                log.warning("the run goes on %d", i)
        log.warning("and past the run's logging")
        Path(sys.argv[2]).write_text("ran on")
    """)
    log, done = tmp_path / ".logs" / "r.log", tmp_path / "done"
    proc = subprocess.Popen([sys.executable, "-c", script, str(log), str(done)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PREFECT_HOME": str(tmp_path / ".prefect-home")})
    try:
        seen = []
        while not any("ready" in line for line in seen):
            line = proc.stderr.readline()
            assert line, "the process ended before it logged:\n" + "".join(seen)
            seen.append(line)
        proc.stdout.close()
        proc.stderr.close()
        proc.stdin.write("go\n")
        proc.stdin.close()
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert done.read_text() == "ran on"
    assert "the run goes on 2" in log.read_text()
