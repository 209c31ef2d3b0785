"""The dask scheduler a release runs on is the operator's setting, never the spec's.

Whoever writes a spec is not trusted with raw data, and the scheduler (with its workers) sees every partition
and every exact statistic before noise: a spec naming a scheduler of its author's choosing is refused by the
schema. The operator names one with $DPRELEASE_DASK_ADDRESS or `dask_address` in the config.toml that also
holds the ledger setting; the variable wins over the file; without either, each run starts a local cluster.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tasks import settings
from tasks.errors import ReleaseError, SpecError
from tasks.params import DaskSpec
from tasks.spec import parse_spec
from tests.conftest import blobs, budget, flow_run_logs, spec_dict, write_csv

DASK_ADDRESS_ENV = "DPRELEASE_DASK_ADDRESS"


def configured_dask_address():
    return settings.current().dask_address


@pytest.fixture(autouse=True)
def operator_config(tmp_path, monkeypatch) -> Path:
    """No operator scheduler unless a test sets one; config.toml in a folder of the test's own."""
    monkeypatch.delenv(DASK_ADDRESS_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    path = tmp_path / "xdg" / "dprelease" / "config.toml"
    path.parent.mkdir(parents=True)
    return path


def _with_dask(tmp_path, dask: dict) -> dict:
    return {**spec_dict(tmp_path, write_csv(tmp_path / "b.csv", blobs(50))), "dask": dask}


# -- the spec cannot choose the scheduler ------------------------------------------------------------------------

@pytest.mark.parametrize("dask", [{"address": "tcp://203.0.113.7:8786"}, {"address": "tcp://127.0.0.1:8786",
                                                                          "n_workers": 2},
                                  {"address": None}], ids=["remote", "with-workers", "null"])
def test_a_spec_naming_a_scheduler_is_refused_by_the_schema(tmp_path, dask):
    with pytest.raises(SpecError) as refused:
        parse_spec(_with_dask(tmp_path, dask))
    message = str(refused.value)
    assert "\n" not in message
    assert "dask: the dask scheduler is the operator's setting, not a spec field" in message
    assert "remove `address`" in message and DASK_ADDRESS_ENV in message and "config.toml" in message


def test_the_refusal_holds_when_the_operator_set_the_same_address(tmp_path, monkeypatch):
    monkeypatch.setenv(DASK_ADDRESS_ENV, "tcp://127.0.0.1:8786")
    with pytest.raises(SpecError, match="operator's setting"):
        parse_spec(_with_dask(tmp_path, {"address": "tcp://127.0.0.1:8786"}))


def test_the_local_cluster_knobs_stay_in_the_spec(tmp_path):
    spec = parse_spec(_with_dask(tmp_path, {"n_workers": 2, "threads_per_worker": 1, "processes": False}))
    assert spec.dask == DaskSpec(n_workers=2, threads_per_worker=1, processes=False)
    assert not hasattr(spec.dask, "address")
    with pytest.raises(SpecError, match="dask.scheduler"):  # no other name for it either
        parse_spec(_with_dask(tmp_path, {"scheduler": "tcp://203.0.113.7:8786"}))


def _dprelease(tmp_path, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / ".prefect-home")}
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300)


def test_the_cli_refuses_it_with_exit_2_before_anything_runs_and_never_connects(tmp_path):
    """`spec check` and `run`: one `error:` line, exit 2, no run folder, and the spec's scheduler (a socket
    listening here) never sees a connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    budget("blobs")  # a registered budget: the refusal is the schema's, not the ledger's
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(_with_dask(tmp_path, {"address": f"tcp://127.0.0.1:{port}"})))
    try:
        for command in (("spec", "check"), ("run",)):
            out = _dprelease(tmp_path, *command, str(tmp_path / "s.yaml"))
            lines = [line for line in out.stderr.splitlines() if line.strip()]
            assert out.returncode == 2, out.stderr
            assert len(lines) == 1 and lines[0].startswith("error:"), out.stderr
            assert "the dask scheduler is the operator's setting" in lines[0] and DASK_ADDRESS_ENV in lines[0]
        assert not (tmp_path / "runs").exists()
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()


# -- the operator's setting --------------------------------------------------------------------------------------

def test_no_setting_means_a_local_cluster():
    assert configured_dask_address() is None


def test_the_environment_variable_names_the_scheduler(monkeypatch):
    monkeypatch.setenv(DASK_ADDRESS_ENV, "tcp://10.0.0.5:8786")
    assert configured_dask_address() == "tcp://10.0.0.5:8786"


def test_config_toml_names_the_scheduler_when_the_variable_is_unset_or_empty(operator_config, monkeypatch):
    assert settings.config_file() == operator_config
    operator_config.write_text('ledger = "/var/lib/dprelease/ledger.sqlite"\ndask_address = "tcp://sched.internal:8786"\n')
    assert configured_dask_address() == "tcp://sched.internal:8786"
    monkeypatch.setenv(DASK_ADDRESS_ENV, "")  # empty counts as unset, as for the ledger
    assert configured_dask_address() == "tcp://sched.internal:8786"


def test_the_variable_wins_over_config_toml(operator_config, monkeypatch):
    operator_config.write_text('dask_address = "tcp://sched.internal:8786"\n')
    monkeypatch.setenv(DASK_ADDRESS_ENV, "tcp://[::1]:8786")
    assert configured_dask_address() == "tcp://[::1]:8786"
    operator_config.write_text("this is = not toml =\n")  # the operator's broken file is said so, whatever is set
    with pytest.raises(ReleaseError, match="is not valid TOML"):
        configured_dask_address()


@pytest.mark.parametrize("value", ["127.0.0.1:8786", "http://127.0.0.1:8786", "tcp://127.0.0.1", "tcp://:8786",
                                   "tcp://127.0.0.1:0", "tcp://127.0.0.1:99999", "tcp://host:8786/path",
                                   "tcp://a b:8786", "local", "tcp://127.0.0.1:8786\ntcp://x:1"])
def test_a_bad_variable_is_refused_in_one_line(monkeypatch, value):
    monkeypatch.setenv(DASK_ADDRESS_ENV, value)
    with pytest.raises(ReleaseError) as refused:
        configured_dask_address()
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"{DASK_ADDRESS_ENV} must be a dask scheduler address tcp://HOST:PORT")
    assert repr(value) in message


@pytest.mark.parametrize("text, expected", [
    ('dask_address = "sched:8786"\n', "must be a dask scheduler address tcp://HOST:PORT"),
    ("dask_address = 8786\n", "must be a dask scheduler address tcp://HOST:PORT (or tls://HOST:PORT), got 8786"),
    ("dask_address = [\n", "is not valid TOML"),
])
def test_a_bad_config_value_is_refused_in_one_line(operator_config, text, expected):
    operator_config.write_text(text)
    with pytest.raises(ReleaseError) as refused:
        configured_dask_address()
    message = str(refused.value)
    assert "\n" not in message and expected in message and str(operator_config) in message


# -- the run uses the operator's setting ---------------------------------------------------------------------------

def test_dask_client_connects_to_the_operator_scheduler_and_ignores_the_local_knobs(monkeypatch):
    from distributed import LocalCluster

    from tasks.partitions import dask_client

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, host="127.0.0.1",
                      protocol="tcp://", dashboard_address="127.0.0.1:0") as operators:
        monkeypatch.setenv(DASK_ADDRESS_ENV, operators.scheduler_address)
        with dask_client(DaskSpec(n_workers=3)) as client:
            assert client.scheduler.address == operators.scheduler_address
            assert len(client.scheduler_info()["workers"]) == 1
            assert client.submit(sum, [1, 2, 3]).result() == 6


def test_dask_client_refuses_a_bad_setting_before_connecting(monkeypatch):
    from tasks.partitions import dask_client

    monkeypatch.setenv(DASK_ADDRESS_ENV, "scheduler.example")
    with pytest.raises(ReleaseError, match=f"{DASK_ADDRESS_ENV} must be a dask scheduler address"):
        with dask_client(DaskSpec()):
            pytest.fail("connected")


def test_without_a_setting_dask_client_starts_a_local_cluster_on_loopback():
    from tasks.partitions import dask_client

    with dask_client(DaskSpec(n_workers=1, threads_per_worker=1)) as client:
        assert client.scheduler.address.startswith("tls://127.0.0.1:")


# -- who may connect ----------------------------------------------------------------------------------------------

_CONNECT = """
import sys
from distributed import Client
from distributed.security import Security
security = Security.temporary() if sys.argv[2] == "own-ca" else None
try:
    with Client(sys.argv[1], timeout="5s", security=security) as c:
        print("CONNECTED", c.submit(sum, [1, 2]).result())
except Exception as exc:
    print("REFUSED", type(exc).__name__)
"""


@pytest.mark.parametrize("credentials", ["none", "own-ca"])
def test_no_client_without_the_runs_credentials_connects_to_its_local_cluster(credentials):
    """A run's local cluster takes connections only from holders of its temporary certificates: a client with
    none, or with certificates of its own CA, is refused (an attacker's review ran code in a plain-TCP cluster's
    worker that read the owner-only raw copy of the data). The same check as another local account:
    tests/operations (`runuser`)."""
    from tasks.partitions import dask_client

    with dask_client(DaskSpec(n_workers=1, threads_per_worker=1)) as client:
        address = client.scheduler.address
        for scheme in ("tls", "tcp"):
            out = subprocess.run([sys.executable, "-c", _CONNECT, address.replace("tls://", f"{scheme}://"),
                                  credentials], capture_output=True, text=True, timeout=120).stdout
            assert "REFUSED" in out and "CONNECTED" not in out, (scheme, out)


def test_the_operators_tls_settings_reach_its_scheduler(tmp_path, monkeypatch):
    from distributed import LocalCluster
    from distributed.security import Security

    from tasks.partitions import dask_client

    security = Security.temporary()
    files = {}
    for name, pem in (("ca", security.tls_ca_file), ("cert", security.tls_client_cert),
                      ("key", security.tls_client_key)):
        files[name] = tmp_path / f"{name}.pem"
        files[name].write_text(pem)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, host="127.0.0.1", security=security,
                      dashboard_address="127.0.0.1:0") as operators:
        monkeypatch.setenv(DASK_ADDRESS_ENV, operators.scheduler_address)
        with pytest.raises(ReleaseError, match="takes TLS: give dask_tls_ca_file"):
            with dask_client(DaskSpec()):
                pytest.fail("connected without the operator's certificates")
        monkeypatch.setenv("DPRELEASE_DASK_TLS_CA_FILE", str(files["ca"]))
        monkeypatch.setenv("DPRELEASE_DASK_TLS_CERT", str(files["cert"]))
        monkeypatch.setenv("DPRELEASE_DASK_TLS_KEY", str(files["key"]))
        with dask_client(DaskSpec()) as client:
            assert client.submit(sum, [1, 2, 3]).result() == 6


_RAW_CLIENT = """
import socket, ssl, sys
port = int(sys.argv[1])
with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:  # a plain dask comm greets at once
    try:
        print("PLAIN GREETING" if plain.recv(1) else "PLAIN closed")
    except socket.timeout:
        print("PLAIN silent")
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
try:
    with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=20)) as tls:
        tls.sendall(bytes(8))
        print("TLS CONNECTED" if tls.recv(1) else "TLS closed")
except Exception as exc:
    print("TLS REFUSED", type(exc).__name__)
"""


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/python3").exists()
                    or not Path("/usr/sbin/runuser").exists(),
                    reason="needs root, runuser and the system Python to act as another local account")
def test_another_local_account_cannot_connect_to_a_runs_cluster():
    """The attacker's review: another local account connected to a running release's plain-TCP scheduler. As the
    account `nobody`, a client gets no greeting in plain TCP (a plain dask scheduler greets any connection) and
    completes no TLS connection without the run's certificate."""
    from distributed import LocalCluster

    from tasks.partitions import dask_client

    def probe(address: str) -> list[str]:
        return subprocess.run(["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c", _RAW_CLIENT,
                               address.rsplit(":", 1)[1]],
                              capture_output=True, text=True, timeout=90).stdout.split("\n")

    with dask_client(DaskSpec(n_workers=1, threads_per_worker=1)) as client:
        plain, tls = probe(client.scheduler.address)[:2]
        assert plain in ("PLAIN silent", "PLAIN closed") and tls.startswith("TLS REFUSED"), (plain, tls)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, host="127.0.0.1", protocol="tcp://",
                      dashboard_address="127.0.0.1:0") as before:  # what runs used to start: the probe is answered
        assert probe(before.scheduler_address)[0] == "PLAIN GREETING"


# ---- the team's dask configuration, where the operator's settings are unset (tasks/scheduler.py) -------------------
def _closed_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{sock.getsockname()[1]}"


def test_the_teams_dask_configuration_names_the_scheduler_where_the_operator_does_not(monkeypatch):
    """`scheduler-address` of dask's configuration: the client connects to that scheduler and runs there, the source
    is named; the operator's dask_address, when set, wins over it (the authority on who sees raw data)."""
    import dask.config
    from distributed import LocalCluster

    from tasks import scheduler
    from tasks.partitions import dask_client

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, host="127.0.0.1",
                      protocol="tcp://", dashboard_address="127.0.0.1:0") as teams, \
            LocalCluster(n_workers=1, threads_per_worker=1, processes=False, host="127.0.0.1",
                         protocol="tcp://", dashboard_address="127.0.0.1:0") as operators:
        with dask.config.set({"scheduler-address": teams.scheduler_address}):
            assert "dask's configuration `scheduler-address`" in scheduler.chosen().source
            with dask_client(DaskSpec()) as client:
                assert client.scheduler.address == teams.scheduler_address
                assert client.submit(sum, [1, 2, 3]).result() == 6
        with dask.config.set({"scheduler-address": _closed_address()}):
            monkeypatch.setenv(DASK_ADDRESS_ENV, operators.scheduler_address)
            assert scheduler.chosen().source.startswith("the operator's setting dask_address")
            with dask_client(DaskSpec()) as client:
                assert client.scheduler.address == operators.scheduler_address
    with dask.config.set({"scheduler-address": "sched:8786"}):
        monkeypatch.delenv(DASK_ADDRESS_ENV)
        with pytest.raises(ReleaseError, match=r"dask's configuration `scheduler-address` .* must be a dask "
                                               r"scheduler address tcp://HOST:PORT"):
            scheduler.chosen()


def test_the_teams_dask_tls_configuration_reaches_a_tls_scheduler(tmp_path):
    """A tls:// scheduler from dask's configuration: refused in one line without a CA, certificate and key; with
    dask's `distributed.comm.tls.*` (the team's files) the client connects."""
    import dask.config
    from distributed import LocalCluster
    from distributed.security import Security

    from tasks.partitions import dask_client

    security = Security.temporary()
    files = {}
    for name, pem in (("ca-file", security.tls_ca_file), ("client.cert", security.tls_client_cert),
                      ("client.key", security.tls_client_key)):
        files[name] = tmp_path / f"{name}.pem"
        files[name].write_text(pem)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, host="127.0.0.1", security=security,
                      dashboard_address="127.0.0.1:0") as teams:
        with dask.config.set({"scheduler-address": teams.scheduler_address}):
            with pytest.raises(ReleaseError, match="takes TLS, and neither the operator's dask_tls_"):
                with dask_client(DaskSpec()):
                    pytest.fail("connected without certificates")
            with dask.config.set({f"distributed.comm.tls.{k}": str(v) for k, v in files.items()}):
                with dask_client(DaskSpec()) as client:
                    assert client.submit(sum, [1, 2, 3]).result() == 6


_CHOSEN = "from tasks.scheduler import chosen; c = chosen(); print(c.address); print(c.source)"


def test_dask_loads_the_teams_configuration_from_its_files_and_variables(tmp_path):
    """As dask loads it in a new process: a YAML file in $DASK_CONFIG, and DASK_SCHEDULER_ADDRESS over it."""
    (tmp_path / "dask").mkdir()
    (tmp_path / "dask" / "team.yaml").write_text("scheduler-address: tcp://10.0.0.7:8786\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DASK_", "DPRELEASE_DASK"))}
    env |= {"DASK_CONFIG": str(tmp_path / "dask"), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    from_file = subprocess.run([sys.executable, "-c", _CHOSEN], capture_output=True, text=True, timeout=60, env=env)
    assert from_file.stdout.splitlines()[0] == "tcp://10.0.0.7:8786", from_file.stderr
    env["DASK_SCHEDULER_ADDRESS"] = "tcp://10.0.0.8:8786"
    from_env = subprocess.run([sys.executable, "-c", _CHOSEN], capture_output=True, text=True, timeout=60, env=env)
    assert from_env.stdout.splitlines()[0] == "tcp://10.0.0.8:8786", from_env.stderr
    assert "dask's configuration" in from_env.stdout


@pytest.mark.usefixtures("prefect_api")
def test_a_release_runs_on_the_scheduler_of_the_teams_dask_configuration(tmp_path):
    """A release with no operator scheduler and DASK's `scheduler-address` pointing at a running scheduler: its
    stages run there, and its log says which source chose it (the address only in the internal log)."""
    import dask.config
    from distributed import LocalCluster
    from prefect import get_client

    from flows.release import release

    data = write_csv(tmp_path / "x.csv", blobs(300)[:, :1], header=("x",))
    budget("values")
    spec = {"dataset": {"id": "values", "path": str(data), "header": True, "bounds": {"x": [0, 100]}},
            "release": {"kind": "histogram", "bins": 16, "branching": 4, "epsilon": 0.5},
            "output_dir": str(tmp_path / "runs"), "evaluate": False}
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, host="127.0.0.1",
                      protocol="tcp://", dashboard_address="127.0.0.1:0") as teams, \
            dask.config.set({"scheduler-address": teams.scheduler_address}):
        before = teams.scheduler.transition_counter
        state = release(spec=spec, return_state=True)
        assert state.result()["status"] == "published"
        assert teams.scheduler.transition_counter > before  # the stages ran on the team's scheduler
    said, deadline = [], time.monotonic() + 30
    while not any("dask scheduler:" in m for m in said) and time.monotonic() < deadline:  # logs arrive in batches
        time.sleep(1)
        with get_client(sync_client=True) as client:
            said = flow_run_logs(client, state.state_details.flow_run_id)
    assert any("dask scheduler: dask's configuration `scheduler-address`" in m for m in said), said
    assert not any(teams.scheduler_address in m for m in said)
