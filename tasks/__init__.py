"""Prefect tasks of the release pipeline: one I/O-bounded step each.

Environment defaults that Prefect, dask and great-expectations need on an offline machine are set here,
before any of them is imported (see ../shared/ECOSYSTEM.md): no telemetry, a cold-start timeout long
enough for the ephemeral API on a 2-core machine, quiet dask logs.
"""

import os

for _key, _value in {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "DASK_LOGGING__DISTRIBUTED": "warning",
    "GX_ANALYTICS_ENABLED": "False",
}.items():
    os.environ.setdefault(_key, _value)
