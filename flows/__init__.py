"""Prefect flows of the release pipeline and the `dprelease` command line."""
