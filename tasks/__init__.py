"""Prefect tasks of the release pipeline: one I/O-bounded step each. Process settings (telemetry off, the
ephemeral API's start-up timeout) are applied by the entry points, see flows/environment.py."""
