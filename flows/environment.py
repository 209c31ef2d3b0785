"""Process environment defaults for Prefect, dask and great-expectations on an offline machine
(../shared/ECOSYSTEM.md). Not the operator's settings of releases (those are `tasks.settings`).

They are applied explicitly by each entry point before Prefect is imported — the CLI's `main`, the test
suite's conftest — and, for flow runs started by a worker, come from the deployment's job variables
(deployments/prefect.yaml) or the operator's Prefect profile. Importing the package changes nothing.
An operator's own value always wins: these are defaults (`setdefault`).
"""

from __future__ import annotations

import os

DEFAULTS = {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # The ephemeral API's cold start takes 16-18 s on a 2-core machine; Prefect's default limit is 20 s.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "DASK_LOGGING__DISTRIBUTED": "warning",
    "GX_ANALYTICS_ENABLED": "False",
}


def apply_defaults() -> None:
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
