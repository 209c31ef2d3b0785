"""Prefect flows of the release pipeline and the `dprelease` command line."""

import tasks  # noqa: F401  (Prefect/dask environment defaults, set before either is imported)
