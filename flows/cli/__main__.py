"""`python -m flows.cli`: the `dprelease` program, as its entry point runs it."""

from flows.cli import entry_point

entry_point()
