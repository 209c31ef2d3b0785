"""Releases where teams keep their data: inputs, scratch and outputs on an S3 API (a real one, moto's server on
loopback, as s3fs and dask test their own S3 code), the ledger binding a URL, a catalogue downstream tools read."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from tasks.ledger import LEDGER_ENV
from tests.conftest import ledger
from tests.processes import dask_cluster

moto_server = pytest.importorskip("moto.server", reason="moto[server] (the test extra) runs the S3 API")
S3_ENV = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")


@pytest.fixture(scope="module")
def s3_server():
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_DEFAULT_REGION": "us-east-1"}
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch, request):
    """Fresh buckets `data`, `private` and `public` for the test, the client environment set as a host's would be."""
    import boto3
    import s3fs

    for key, value in s3_server.items():
        monkeypatch.setenv(key, value)
    # s3fs caches one filesystem per constructor arguments, with the endpoint it read from the environment then:
    # another module's server (another port) would otherwise be asked.
    s3fs.S3FileSystem.clear_instance_cache()
    client = boto3.client("s3")
    for bucket in ("data", "private", "public"):
        existing = client.list_objects_v2(Bucket=bucket).get("Contents", []) if _exists(client, bucket) else []
        for o in existing:
            client.delete_object(Bucket=bucket, Key=o["Key"])
        if not _exists(client, bucket):
            client.create_bucket(Bucket=bucket)
    return client


def _exists(client, bucket: str) -> bool:
    return bucket in {b["Name"] for b in client.list_buckets()["Buckets"]}


def _keys(client, bucket: str) -> list[str]:
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", []))


def _put_values(client, key: str, n: int = 2000, seed: int = 0) -> str:
    values = np.random.default_rng(seed).uniform(0, 100, n)
    client.put_object(Bucket="data", Key=key, Body=("x\n" + "\n".join(f"{v:.3f}" for v in values) + "\n").encode())
    return f"s3://data/{key}"


def _histogram(source: str, tmp_path: Path, **extra) -> dict:
    return {"dataset": {"id": "sensors", "path": source, "header": True, "bounds": {"x": [0, 100]}},
            "release": {"kind": "histogram", "bins": 16, "branching": 4, "epsilon": 0.5},
            "output_dir": str(tmp_path / "runs"), "evaluate": False, **extra}


def _cli(*args, cwd=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env={**os.environ, **(env or {})})


def test_budget_set_binds_a_url_and_a_spec_is_admitted_by_it(s3, tmp_path):
    """`budget set --source s3://...` bound a local folder named `s3:/bucket/...` (the URL mangled into a path)."""
    source = _put_values(s3, "sensors/part-0.csv")
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(_histogram(source, tmp_path)))
    bound = _cli("budget", "set", "sensors", "--epsilon", "2", "--source", source, "--reading-from",
                 str(tmp_path / "spec.yaml"))
    assert bound.returncode == 0, bound.stderr
    assert ledger().source("sensors") == "s3://data/sensors/part-0.csv"
    checked = _cli("spec", "check", str(tmp_path / "spec.yaml"))
    assert checked.returncode == 0, checked.stderr
    s3.put_object(Bucket="data", Key="sensors/part-1.csv", Body=b"x\n1\n")
    other = _histogram("s3://data/sensors/part-1.csv", tmp_path)
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    refused = _cli("spec", "check", str(tmp_path / "other.yaml"))
    assert refused.returncode == 2 and "is bound to the data s3://data/sensors/part-0.csv; this release reads " \
        "s3://data/sensors/part-1.csv" in refused.stderr


@pytest.mark.parametrize("location, problem", [
    ("xyz://bucket/data.csv", "the scheme xyz:// is not supported"),
    ("s3:///data.csv", "names no bucket or container"),
    ("s3://data/../secret.csv", "has a '..' in its path"),
])
def test_an_unsupported_url_is_one_line_before_anything_runs(location, problem, tmp_path):
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(_histogram(location, tmp_path)))
    for command in (["spec", "check"], ["run"]):
        out = _cli(*command, str(tmp_path / "spec.yaml"))
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and problem in out.stderr, out.stderr
    assert not (tmp_path / "runs").exists()


def test_a_store_whose_package_is_missing_names_the_extra(tmp_path):
    from tasks import storage
    from tasks.errors import Refused

    missing = next((s for s, package in storage.SCHEMES.items() if package and
                    __import__("importlib").util.find_spec(package) is None), None)
    if missing is None:
        pytest.skip("every store's package is installed here")
    with pytest.raises(Refused, match=r'pip install "dprelease\['):
        storage.check_supported(f"{missing}://bucket/data.csv", "dataset.path")


@pytest.mark.usefixtures("prefect_api")
def test_a_release_reads_writes_and_publishes_on_the_store(s3, tmp_path, monkeypatch):
    """Inputs, scratch and output on the S3 API: the raw-derived partitions and the measurements in the private
    bucket only, the release under its prefix in the public bucket with its manifest, files that describe themselves
    and a catalogue row; a resume on a host without the run folder draws nothing again; data changed between the
    checks and the read is refused."""
    from flows.release import release
    from tasks import storage
    from tasks.storage import catalogue

    monkeypatch.setenv("DPRELEASE_SCRATCH", "s3://private/scratch")
    monkeypatch.setenv("DPRELEASE_OUTPUT", "s3://public/releases")
    source = _put_values(s3, "sensors/part-0.csv")
    ledger().set_budget("sensors", 5.0, 0.0, source=source)
    summary = release(spec=_histogram(source, tmp_path, release_id="s3-1"))
    prefix = "releases/dataset=sensors/kind=histogram/release=s3-1/"
    public = _keys(s3, "public")
    assert summary["published_at"] == f"s3://public/{prefix.rstrip('/')}"
    published = ("manifest.json", "histogram.parquet", "consistency.json", "measurements/measurements.json",
                 "measurements/noisy_strategy.parquet", "measurements/strategy.npz", "noisy_strategy.parquet",
                 "uncertainty.json", "histogram_replicates.parquet")  # the noisy strategy with its intervals at the top
    assert public == sorted([prefix + k for k in published] +
                            ["releases/catalogue/release=s3-1.parquet"])  # nothing raw-derived is public
    private = [k for k in _keys(s3, "private") if not k.startswith("scratch/.gx/")]  # the contracts' project apart
    # the raw-derived stage outputs removed once published; the measurements kept
    assert "scratch/s3-1/measurements/measurements.json" in private and \
        all(k.startswith("scratch/s3-1/measurements/") for k in private), private
    manifest = json.loads(storage.read_bytes(f"s3://public/{prefix}manifest.json"))
    described = storage.read_table(f"s3://public/{prefix}histogram.parquet").schema.metadata
    assert described[b"dprelease.release_id"] == b"s3-1" and described[b"dprelease.kind"] == b"histogram"
    assert described[b"dprelease.manifest_sha256"].decode() == manifest["manifest_sha256"]["sha256"]
    [row] = catalogue.rows("s3://public/releases")
    assert row["release_id"] == "s3-1" and row["epsilon"] == manifest["privacy"]["epsilon"]
    assert row["location"] == summary["published_at"] and f"s3://public/{prefix}manifest.json" in row["files"]
    assert _link_artifact("release-sensors") == summary["published_at"]  # the store's copy, not the worker's

    # Another host resumes the release as if its publication had failed (nothing public, the ledger at `measured`):
    # no run folder here, the measurements come from the scratch store, and nothing is drawn again.
    import shutil

    for key in _keys(s3, "public"):
        s3.delete_object(Bucket="public", Key=key)
    ledger().mark("s3-1", "measured")
    shutil.rmtree(tmp_path / "runs")
    again = release(spec=_histogram(source, tmp_path, release_id="s3-1"))
    assert again["status"] == "published" and sorted(_keys(s3, "public")) == public
    assert [(r["status"], r["attempts"]) for r in ledger().releases("sensors")] == [("published", 1)]
    # A third host finds the release public: it completes it from there, publishing nothing twice.
    shutil.rmtree(tmp_path / "runs")
    assert release(spec=_histogram(source, tmp_path, release_id="s3-1"))["status"] == "already published"

    # The data changed between the checks and the read: refused, nothing drawn or charged.
    from tasks import admission

    checked = admission.admit_run

    def check_then_replace(*args):
        plan = checked(*args)
        s3.put_object(Bucket="data", Key="sensors/part-0.csv", Body=b"x\n1\n2\n")
        return plan
    monkeypatch.setattr(admission, "admit_run", check_then_replace)
    from tasks.errors import InputError

    with pytest.raises(InputError, match="changed since the run's checks"):
        release(spec=_histogram(source, tmp_path, release_id="s3-2"))
    assert [r["release_id"] for r in ledger().releases("sensors")] == ["s3-1"]


@pytest.mark.usefixtures("prefect_api")
def test_duckdb_and_polars_read_the_daily_releases_as_one_table(tmp_path, monkeypatch):
    """Daily histogram releases of one dataset in a local output location: the catalogue and the releases read as one
    table each (the queries of docs/how-to/object-storage.md); every published file is a Prefect asset materialised by
    its flow run, with the release id, dataset and privacy spend as metadata."""
    import duckdb
    import polars as pl

    from flows.release import release
    from tests.conftest import write_csv

    output = tmp_path / "public"
    monkeypatch.setenv("DPRELEASE_OUTPUT", str(output))
    data = write_csv(tmp_path / "v.csv", np.column_stack([np.random.default_rng(1).uniform(0, 100, 500)]),
                     header=("x",))
    ledger().set_budget("sensors", 10.0, 0.0, source=str(data))
    days = ["20261101", "20261102", "20261103"]
    for day in days:
        state = release(spec=_histogram(str(data), tmp_path, release_id=f"sensors-histogram-{day}"), period="daily",
                        return_state=True)
    catalogue = duckdb.sql(f"SELECT release_id, epsilon FROM read_parquet('{output}/catalogue/*.parquet') "
                           f"WHERE dataset_id = 'sensors' ORDER BY release_id").fetchall()
    assert [r[0] for r in catalogue] == [f"sensors-histogram-{d}" for d in days]
    series = duckdb.sql(f"SELECT release, bin, count FROM read_parquet('{output}/dataset=sensors/kind=histogram/*/"
                        f"histogram.parquet', hive_partitioning = true) ORDER BY release, bin").fetchall()
    assert len(series) == 16 * len(days) and {r[0] for r in series} == {f"sensors-histogram-{d}" for d in days}
    frame = pl.read_parquet(f"{output}/dataset=sensors/kind=histogram/*/histogram.parquet", hive_partitioning=True)
    assert frame.height == 16 * len(days) and set(frame["release"].unique()) == {f"sensors-histogram-{d}" for d in days}
    listed = json.loads(_cli("releases", "list", "--output", str(output), "--dataset", "sensors", "--json").stdout)
    assert [r["release_id"] for r in listed] == [f"sensors-histogram-{d}" for d in days]

    # Lineage: one stable asset for the dataset and kind, materialised once per release (its id in the
    # materialisation's metadata) from the input dataset's asset; the link artifact names the published location.
    summary = state.result()
    table = f"file://{output}/dataset=sensors/kind=histogram"
    events = _materialisations(table, len(days))
    assert sorted(e["payload"]["release_id"] for e in events) == [f"sensors-histogram-{d}" for d in days]
    run_id = str(state.state_details.flow_run_id)
    last = next(e for e in events if e["payload"]["release_id"] == summary["release_id"])
    assert last["payload"]["location"] == summary["published_at"] and "histogram.parquet" in last["payload"]["files"]
    assert any(r.get("prefect.resource.id") == f"prefect.flow-run.{run_id}" for r in last["related"]), last["related"]
    assert any(r.get("prefect.resource.id") == f"file://{data}" and r.get("prefect.resource.role") == "asset"
               for r in last["related"]), last["related"]  # the input dataset, upstream
    linked = _link_artifact("release-sensors")  # the published copy, not the run folder's working copy
    assert linked == Path(summary["published_at"]).as_uri() and "/runs/" not in linked, linked


def _materialisations(key: str, n: int) -> list[dict]:
    """The asset materialisation events of `key` (at least `n` of them: events reach the server asynchronously)."""
    from prefect.client.orchestration import get_client
    from prefect.events.worker import EventsWorker

    events: list[dict] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        EventsWorker.drain_all(timeout=30)
        with get_client(sync_client=True) as client:
            events = client.request("POST", "/events/filter", json={"filter": {
                "event": {"name": ["prefect.asset.materialization.succeeded"]},
                "resource": {"id": [key]}, "occurred": {"since": "2000-01-01T00:00:00Z"}},
                "limit": 50}).json()["events"]
        if len(events) >= n:
            break
        time.sleep(1)
    assert len(events) >= n, events
    return events


def _link_artifact(key: str) -> str:
    """The link of the latest artifact `key`."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        [latest] = client.read_latest_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    return re.fullmatch(r"\[.*\]\((.*)\)", latest.data).group(1)


def _specs(data: dict[str, str], tmp_path: Path, tag: str) -> list[dict]:
    """A histogram, a k-means and a kernel k-means release of the data at `data` (locations)."""
    out = str(tmp_path / f"runs-{tag}")
    return [
        {"dataset": {"id": "values", "path": data["values"], "header": True, "bounds": {"x": [0, 100]}},
         "release": {"kind": "histogram", "bins": 16, "branching": 4, "epsilon": 0.5}, "output_dir": out,
         "evaluate": False, "release_id": f"h-{tag}"},
        {"dataset": {"id": "points", "path": data["points"], "header": True,
                     "bounds": {"x": [0, 100], "y": [0, 100]}},
         "release": {"kind": "kmeans", "k": 3, "iterations": 3, "epsilon": 1.0, "postprocess": ["consistency"]},
         "output_dir": out, "evaluate": False, "release_id": f"k-{tag}"},
        {"dataset": {"id": "sets", "path": data["sets"], "items_column": "items", "item_count": 40},
         "release": {"kind": "kernel_kmeans", "k": 2, "iterations": 2, "features": 16, "gamma": 0.05,
                     "epsilon": 2.0, "delta": 1e-6}, "output_dir": out, "evaluate": False, "release_id": f"kk-{tag}"},
    ]


def _write_data(folder: str) -> dict[str, str]:
    """The three datasets at a location (a local folder or an S3 prefix)."""
    import pyarrow as pa

    from tasks import storage

    rng = np.random.default_rng(3)
    storage.write_bytes(storage.join(folder, "values.csv"),
                        ("x\n" + "\n".join(f"{v:.3f}" for v in rng.uniform(0, 100, 3000)) + "\n").encode())
    X = np.clip(rng.normal([30, 70], 8, (3000, 2)), 0, 100)
    storage.write_bytes(storage.join(folder, "points.csv"),
                        ("x,y\n" + "\n".join(f"{a:.3f},{b:.3f}" for a, b in X) + "\n").encode())
    for part in range(2):  # a folder of two partitions
        records = [sorted(set(rng.choice(40, rng.integers(1, 8), replace=False).tolist())) for _ in range(500)]
        storage.write_table(pa.table({"items": pa.array(records, type=pa.list_(pa.int32()))}),
                            storage.join(folder, "sets", f"part.{part}.parquet"))
    return {"values": storage.join(folder, "values.csv"), "points": storage.join(folder, "points.csv"),
            "sets": storage.join(folder, "sets")}


def _structure(location: str) -> dict:
    """A published release's files and, for its Parquet files, their columns."""
    from tasks import storage

    return {storage.relative(f, location): (storage.read_table(f).column_names if f.endswith(".parquet") else None)
            for f in storage.files(location)}


@pytest.mark.slow  # about 2-3 minutes: six releases, a dask scheduler and two worker processes
@pytest.mark.usefixtures("prefect_api")
def test_releases_on_a_cluster_whose_workers_share_no_disk(s3, s3_server, postgres, tmp_path, monkeypatch):
    """A `dask scheduler` and two `dask worker` processes on loopback, each worker in an empty working directory of
    its own with its own temporary folder, the data, the scratch and the output in the S3 API, the ledger on a
    PostgreSQL server (as hosts share it): histogram, k-means and
    kernel k-means releases complete and are published as the same files, with the same columns, as on the local
    disk with a local cluster; a second host's release of one of the datasets joins the first's Data Docs history on
    the store, and `dprelease query s3://...` answers from a published release."""
    from flows.release import release
    from tasks import storage
    from tasks.storage import catalogue

    local = _write_data(str(tmp_path / "local-data"))
    for spec in _specs(local, tmp_path, "local"):
        ledger().set_budget(spec["dataset"]["id"], 10.0, 1e-5, source=spec["dataset"]["path"])
        release(spec=spec)
    expected = {s["release"]["kind"]: _structure(str(tmp_path / "runs-local" / s["release_id"] / "release"))
                for s in _specs(local, tmp_path, "local")}

    remote = _write_data("s3://data/cluster")
    with dask_cluster(tmp_path / "dask", {**s3_server, "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}) as address:
        monkeypatch.setenv("DPRELEASE_DASK_ADDRESS", address)
        monkeypatch.setenv("DPRELEASE_SCRATCH", "s3://private/scratch")
        monkeypatch.setenv("DPRELEASE_OUTPUT", "s3://public/releases")
        monkeypatch.setenv(LEDGER_ENV, postgres.new_database())
        for spec in _specs(remote, tmp_path, "s3"):
            ledger().set_budget(spec["dataset"]["id"] + "-s3", 10.0, 1e-5, source=spec["dataset"]["path"])
            spec["dataset"]["id"] += "-s3"
            assert release(spec=spec)["status"] == "published"
        # A second host (another empty working folder) releases the histogram's dataset again: its contracts join
        # the same great-expectations history on the store.
        again = {**_specs(remote, tmp_path, "s3")[0], "output_dir": str(tmp_path / "host-2" / "runs"),
                 "release_id": "h-s3-host-2"}
        again["dataset"] = {**again["dataset"], "id": "values-s3"}
        (tmp_path / "host-2").mkdir()
        monkeypatch.chdir(tmp_path / "host-2")
        assert release(spec=again)["status"] == "published"
    for row in catalogue.rows("s3://public/releases"):
        assert _structure(row["location"]) == expected[row["kind"]], row["kind"]
    assert len(catalogue.rows("s3://public/releases")) == 4
    for i in range(2):  # the workers wrote nothing where they run
        assert [p for p in (tmp_path / "dask" / f"worker-{i}").rglob("*.parquet")] == []
    kept = [f for f in storage.files("s3://private/scratch") if "/.gx/" not in f]  # the contracts' project apart
    assert kept and all("/measurements/" in f for f in kept), kept  # once published, only the measurements stay
    index = storage.read_bytes("s3://private/scratch/.gx/values-s3/data_docs/index.html").decode()
    assert "h-s3" in index and "h-s3-host-2" in index  # one Data Docs history for both hosts' releases
    histogram = next(r for r in catalogue.rows("s3://public/releases") if r["release_id"] == "h-s3")["location"]
    answered = _cli("query", histogram, "--range", "0", "8", "--json", env=s3_server)
    assert answered.returncode == 0 and json.loads(answered.stdout)["replicates"] > 0, answered.stderr
    assert {r["release_id"] for r in ledger().releases("values-s3")} == {"h-s3", "h-s3-host-2"}


DOWNSTREAM = Path(__file__).resolve().parents[1] / "docs" / "how-to" / "object-storage.md"


def _doc_block(marker: str) -> str:
    """The code block of docs/how-to/object-storage.md under `<!-- tested: MARKER -->`, as a reader copies it."""
    import re

    found = re.search(rf"^<!-- tested: {marker} -->\n```\w+\n(.*?)^```", DOWNSTREAM.read_text(), re.S | re.M)
    assert found, f"docs/how-to/object-storage.md has no block marked {marker}"
    return found.group(1)


@pytest.mark.usefixtures("prefect_api")
def test_the_docs_downstream_reads_run_on_the_store(s3, tmp_path, monkeypatch):
    """Two daily releases published on the S3 API; the how-to's DuckDB (fsspec registered, no httpfs download) and
    polars reads, its `dprelease query s3://...` and `releases list` run as the page writes them and read those
    releases; the query's answer is the one the same release folder gives."""
    from flows.release import release
    from tasks.replicates import Replicates

    s3.create_bucket(Bucket="dprelease-public")
    output = "s3://dprelease-public/releases"
    monkeypatch.setenv("DPRELEASE_OUTPUT", output)
    source = _put_values(s3, "sensors/part-0.csv")
    ledger().set_budget("sensors", 5.0, 0.0, source=source)
    days = ["20261101", "20261102"]
    for day in days:
        release(spec=_histogram(source, tmp_path, release_id=f"sensors-histogram-{day}"), period="daily")

    read = {}
    exec(_doc_block("s3-downstream-python"), read)  # noqa: S102 - the page's code, as a reader runs it
    assert [r[0] for r in read["catalogue"]] == [f"sensors-histogram-{d}" for d in days]
    assert len(read["series"]) == 16 * len(days) and {r[0] for r in read["series"]} == \
        {f"sensors-histogram-{d}" for d in days}
    assert read["frame"].height == 16 * len(days)
    published = Path(tmp_path / "runs" / "sensors-histogram-20261102" / "release")
    local = sorted((r[1], r[2]) for r in read["series"] if r[0] == "sensors-histogram-20261102")
    import pyarrow.parquet as pq

    assert local == sorted(zip(*pq.read_table(published / "histogram.parquet", columns=["bin", "count"])
                               .to_pydict().values()))

    query, listing = _doc_block("s3-downstream-cli").strip().splitlines()
    assert query.startswith("dprelease query s3://") and listing.startswith("dprelease releases list --output s3://")
    answered = _cli(*query.split()[1:], "--json")
    assert answered.returncode == 0, answered.stderr
    answer = json.loads(answered.stdout)
    expected = Replicates.open(published).range_sum(0, 8)
    assert (answer["estimate"], answer["lo"], answer["hi"]) == (expected.estimate, expected.lo, expected.hi)
    listed = _cli(*listing.split()[1:], "--json")
    assert [r["release_id"] for r in json.loads(listed.stdout)] == [f"sensors-histogram-{d}" for d in days]


@pytest.mark.usefixtures("prefect_api")
def test_query_takes_storage_options_where_the_environment_has_none(s3, s3_server, tmp_path):
    """`dprelease query s3://...` on a host whose environment names no endpoint nor keys: refused in one line
    without them, answered with `--storage-options`; a malformed JSON refused without echoing it (it may hold a
    secret)."""
    from tasks import storage

    release = "s3://public/releases/dataset=d/kind=histogram/release=r"
    local = _replicated_release(tmp_path)
    for f in storage.files(str(local)):
        storage.write_bytes(storage.join(release, storage.relative(f, str(local))), Path(f).read_bytes())
    bare = {k: v for k, v in os.environ.items() if k not in S3_ENV} | {
        "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_EC2_METADATA_DISABLED": "true"}

    def query(*args):
        return subprocess.run([sys.executable, "-m", "flows.cli", "query", release, "--range", "0", "4", *args],
                              capture_output=True, text=True, timeout=120, env=bare)
    refused = query()
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "cannot be reached" in refused.stderr, \
        refused.stderr
    given = json.dumps({"key": "test", "secret": "test", "client_kwargs": {
        "endpoint_url": s3_server["AWS_ENDPOINT_URL"], "region_name": "us-east-1"}})
    answered = query("--storage-options", given, "--json")
    assert answered.returncode == 0, answered.stderr
    from tasks.replicates import Replicates

    assert json.loads(answered.stdout)["estimate"] == Replicates.open(str(local)).range_sum(0, 4).estimate
    bad = query("--storage-options", '{"secret": "hunter2"')
    assert bad.returncode == 2 and "not valid JSON" in bad.stderr and "hunter2" not in bad.stderr + bad.stdout


def _replicated_release(tmp_path: Path) -> Path:
    """A local histogram release (bootstrap replicates published beside it)."""
    from flows.release import release
    from tests.conftest import write_csv

    data = write_csv(tmp_path / "v.csv", np.column_stack([np.random.default_rng(5).uniform(0, 100, 400)]),
                     header=("x",))
    ledger().set_budget("d", 5.0, 0.0, source=str(data))
    summary = release(spec={"dataset": {"id": "d", "path": str(data), "header": True, "bounds": {"x": [0, 100]}},
                            "release": {"kind": "histogram", "bins": 16, "branching": 4, "epsilon": 1.0},
                            "output_dir": str(tmp_path / "local"), "evaluate": False, "release_id": "r"})
    return Path(summary["release_dir"])


@pytest.fixture
def fsspec_config():
    """fsspec's process-wide configuration (which a credentials block fills) restored after the test."""
    import fsspec.config
    import s3fs

    from tasks.storage import options

    saved = {k: dict(v) for k, v in fsspec.config.conf.items()}
    yield
    fsspec.config.conf.clear()
    fsspec.config.conf.update(saved)
    options._apply_block.cache_clear()
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.mark.usefixtures("prefect_api", "fsspec_config")
def test_credentials_from_a_prefect_block_where_the_environment_has_none(s3, s3_server, tmp_path, monkeypatch):
    """A host whose environment holds no AWS credentials nor endpoint: refused without a block; with the operator's
    `AwsCredentials` block (saved on the Prefect API) a release reads its input from the store and publishes there,
    and another process (a CLI on another host) that names the block answers a query of it. A block that does not
    exist is one line."""
    import s3fs
    from prefect.settings import PREFECT_API_URL

    from flows.release import release
    from tasks import storage
    from tasks.errors import Unreachable
    from tasks.replicates import Replicates

    prefect_aws = pytest.importorskip("prefect_aws", reason="the aws extra (prefect-aws) reads the block")
    prefect_aws.AwsCredentials(aws_access_key_id="AKIABLOCKKEY", aws_secret_access_key="block-secret-value",
                               region_name="us-east-1",
                               aws_client_parameters={"endpoint_url": s3_server["AWS_ENDPOINT_URL"]}
                               ).save("moto-s3", overwrite=True)
    source = _put_values(s3, "sensors/part-0.csv")
    for key in S3_ENV:
        monkeypatch.delenv(key)
    nothing = {"AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
               "AWS_EC2_METADATA_DISABLED": "true"}
    for key, value in nothing.items():
        monkeypatch.setenv(key, value)
    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(Unreachable):
        storage.probe(source)

    monkeypatch.setenv("DPRELEASE_AWS_CREDENTIALS_BLOCK", "moto-s3")
    monkeypatch.setenv("DPRELEASE_SCRATCH", "s3://private/scratch")
    monkeypatch.setenv("DPRELEASE_OUTPUT", "s3://public/releases")
    ledger().set_budget("sensors", 5.0, 0.0, source=source)
    summary = release(spec=_histogram(source, tmp_path, release_id="blk-1"))
    assert summary["published_at"] == "s3://public/releases/dataset=sensors/kind=histogram/release=blk-1"
    assert "releases/dataset=sensors/kind=histogram/release=blk-1/manifest.json" in _keys(s3, "public")

    host = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | nothing | {
        "PREFECT_API_URL": PREFECT_API_URL.value()}
    query = [sys.executable, "-m", "flows.cli", "query", summary["published_at"], "--range", "0", "4", "--json"]
    answered = subprocess.run(query, capture_output=True, text=True, timeout=120, env=host)
    assert answered.returncode == 0, answered.stderr
    assert json.loads(answered.stdout)["estimate"] == Replicates.open(summary["release_dir"]).range_sum(0, 4).estimate
    missing = subprocess.run(query, capture_output=True, text=True, timeout=120,
                             env=host | {"DPRELEASE_AWS_CREDENTIALS_BLOCK": "no-such-block"})
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
    assert "aws-credentials/no-such-block (DPRELEASE_AWS_CREDENTIALS_BLOCK) does not exist" in missing.stderr
    said = answered.stdout + answered.stderr + missing.stdout + missing.stderr
    assert "AKIABLOCKKEY" not in said and "block-secret-value" not in said  # no key of the block in any message


@pytest.mark.usefixtures("prefect_api")
def test_two_hosts_record_their_contracts_into_one_data_docs_history(s3, tmp_path, monkeypatch):
    """Two releases of one dataset from two empty working folders (two hosts: nothing of the first on the second's
    disk), output and scratch on the S3 API: both releases' contract results are in the one project on the store,
    and the second host's Data Docs index lists the first host's release beside its own; the release report and the
    link artifact point at that site. The great-expectations project's content stays private (the scratch bucket)."""
    import shutil

    from flows.release import release
    from tasks import storage

    monkeypatch.setenv("DPRELEASE_SCRATCH", "s3://private/scratch")
    monkeypatch.setenv("DPRELEASE_OUTPUT", "s3://public/releases")
    source = _put_values(s3, "sensors/part-0.csv")
    ledger().set_budget("sensors", 5.0, 0.0, source=source)
    summaries = []
    for host in ("host-a", "host-b"):
        folder = tmp_path / host
        folder.mkdir()
        monkeypatch.chdir(folder)
        spec = _histogram(source, folder, release_id=f"gx-{host}")
        summaries.append(release(spec=spec))
        shutil.rmtree(folder / "runs" / f"gx-{host}")  # the host's run folder gone: only the store holds the history
    site = "s3://private/scratch/.gx/sensors/data_docs"
    assert [s["data_docs"] for s in summaries] == [f"{site}/index.html"] * 2
    index = storage.read_bytes(f"{site}/index.html").decode()
    assert "gx-host-a" in index and "gx-host-b" in index  # one history: the first host's run on the second's site
    validations = [k for k in _keys(s3, "private") if k.startswith("scratch/.gx/sensors/validations/")]
    for host in ("host-a", "host-b"):
        assert any(f"/gx-{host}/" in k for k in validations), validations
        assert any(k.startswith("scratch/.gx/sensors/data_docs/validations/") and f"/gx-{host}/" in k
                   for k in _keys(s3, "private"))
    assert not any(".gx" in k for k in _keys(s3, "public"))  # raw-derived counts: never in the public bucket
    assert _link_artifact("data-docs-sensors") == f"{site}/index.html"
    assert [p for p in tmp_path.rglob("*") if p.suffix in (".html", ".json") and ".gx" in p.parts] == []  # all remote


def test_the_contracts_store_lists_what_another_host_wrote_since(s3):
    """The great-expectations store on the bucket (data_contracts/object_store.py) lists afresh: a key another host
    wrote after this process listed is in the next listing (the Data Docs index is built from it), and reads back."""
    from data_contracts.object_store import FsspecStoreBackend

    store = FsspecStoreBackend("s3://private/gx/d/validations", filepath_suffix=".json",
                               suppress_store_backend_id=True)
    store.set(("a",), '{"run": "a"}')
    assert store.list_keys() == [("a",)]
    s3.put_object(Bucket="private", Key="gx/d/validations/b.json", Body=b'{"run": "b"}')  # another host's client
    assert store.has_key(("b",)) and store.get(("b",)) == '{"run": "b"}'  # before this process lists again
    s3.put_object(Bucket="private", Key="gx/d/validations/c.json", Body=b'{"run": "c"}')
    assert sorted(store.list_keys()) == [("a",), ("b",), ("c",)]
    assert store.has_key(("a",)) and not store.has_key(("z",))
    assert store.remove_key(("a",)) and sorted(store.list_keys()) == [("b",), ("c",)]
