"""The options several `dprelease` commands share: their argument types, the default output folder, the help of
`--ledger` and `ledger_from`, the ledger it names. Below every command module of flows/cli/, importing none."""

from __future__ import annotations

import argparse
import math

from tasks.ledger import configured_ledger, configured_location, ledger_at
from tasks.ledger.spends import MAX_LIFETIME_EPSILON
from tasks.settings import masked

DEFAULT_OUTPUT = "dprelease-runs"
LEDGER_HELP = ("the ledger: a SQLite file or a postgresql:// URL (default: the `ledger` setting, $DPRELEASE_LEDGER, "
               "config.toml, or ~/.local/state/dprelease/privacy-ledger.sqlite)")


def ledger_from(args, create: bool = True):
    """The ledger of --ledger, else the machine's configured one (`tasks.ledger.configured_ledger`; create=False:
    None where nothing was ever recorded), and its name as messages show it (a URL's password masked)."""
    if args.ledger:
        return ledger_at(args.ledger, create), masked(args.ledger)
    return configured_ledger(create), configured_location()


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def positive_finite(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def lifetime_epsilon(text: str) -> float:
    value = float(text)
    if not 0 < value <= MAX_LIFETIME_EPSILON:  # nan and inf too
        raise argparse.ArgumentTypeError(f"must be a number in (0, {MAX_LIFETIME_EPSILON:g}], got {text}")
    return value


def probability(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def confidence(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {text}")
    return value
