"""Not collected by the suite (no test_ prefix): `tests/operations/test_session_kill.py` runs it in a pytest session of
its own, which it kills, to check that the servers the session started go with it. Its one test starts every kind
of server the suite starts, writes their process ids to $SERVERS_FILE, and waits to be killed."""

from __future__ import annotations

import json
import os
import time
from urllib.parse import urlsplit

import pytest


@pytest.mark.usefixtures("prefect_api")
def test_servers_wait_to_be_killed(prefect_server, postgres, tmp_path):
    from prefect.server.api.server import SubprocessASGIServer

    from tests.processes import dask_cluster

    with dask_cluster(tmp_path / "dask") as address:
        harness = SubprocessASGIServer._instances[None].server_process.pid
        pids = {"prefect_server": int(prefect_server["TEST_PREFECT_SERVER_PID"]), "harness": harness,
                "postgres": postgres.pid, "prefect_port": urlsplit(prefect_server["PREFECT_API_URL"]).port,
                "dask_port": int(address.rsplit(":", 1)[1])}
        with open(os.environ["SERVERS_FILE"], "w") as fh:
            json.dump(pids, fh)
        time.sleep(600)
