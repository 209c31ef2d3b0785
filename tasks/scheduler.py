"""Which dask scheduler a release runs on, and with which TLS credentials. The scheduler and its workers see the raw
partitions and the exact statistics before noise, so the choice is the machine's, never a spec's:

1. the operator's settings (`dask_address`, `dask_tls_*`: tasks/settings.py), the authority where they are given;
2. else the team's dask configuration, as dask loaded it in this process: `scheduler-address` and
   `distributed.comm.tls.*` from `~/.config/dask/*.yaml`, `$DASK_CONFIG` and `DASK_*` variables (e.g.
   `DASK_SCHEDULER_ADDRESS`), which every dask tool of the team already reads (before, they were ignored without a
   word);
3. else a local cluster started by the run (tasks/partitions.py).

`chosen()` names the source of each, for the run's log: the Prefect log says which source (a phrase), the internal
log the address.
"""

from __future__ import annotations

from dataclasses import dataclass

from tasks import settings
from tasks.errors import ReleaseError

#: The dask configuration keys read (dask's own names: `dask config get scheduler-address`).
ADDRESS_KEY = "scheduler-address"
TLS_KEYS = ("distributed.comm.tls.ca-file", "distributed.comm.tls.client.cert", "distributed.comm.tls.client.key")
DASK_SOURCES = "~/.config/dask/*.yaml, $DASK_CONFIG or DASK_* variables"


@dataclass(frozen=True)
class Choice:
    """The scheduler (None: a local cluster), its TLS (a `distributed.security.Security`, or None), where each came
    from, and the scheduler as messages name it (not its address: they reach the Prefect API)."""
    address: str | None
    security: object | None
    source: str
    tls_source: str
    shown: str


def chosen() -> Choice:
    """The scheduler of this machine's releases (see the module docstring)."""
    current = settings.current()
    if current.dask_address:
        security, tls = _security(current.dask_address)
        return Choice(current.dask_address, security,
                      f"the operator's setting dask_address ({settings.env_of('dask_address')})", tls,
                      f"the operator's dask scheduler ({settings.env_of('dask_address')})")
    import dask.config

    address = dask.config.get(ADDRESS_KEY, None)
    if not address:
        return Choice(None, None, "none configured: the run's own local cluster", "the run's temporary certificates",
                      "the run's local dask scheduler")
    address = settings.scheduler_address(address, f"dask's configuration `{ADDRESS_KEY}` ({DASK_SOURCES})")
    security, tls = _security(address)
    return Choice(address, security, f"dask's configuration `{ADDRESS_KEY}` ({DASK_SOURCES}), the operator's "
                                     f"{settings.env_of('dask_address')} being unset", tls,
                  f"the dask scheduler of dask's configuration ({ADDRESS_KEY})")


def _security(address: str) -> tuple[object | None, str]:
    """The operator's TLS settings, else dask's `distributed.comm.tls.*`, else none (refused for a tls:// address)."""
    from distributed.security import Security

    s = settings.current()
    if s.dask_tls_ca_file:  # the settings check that the three go together
        return (Security(tls_ca_file=s.dask_tls_ca_file, tls_client_cert=s.dask_tls_cert,
                         tls_client_key=s.dask_tls_key, require_encryption=True),
                "the operator's dask_tls_* settings")
    import dask.config

    given = [dask.config.get(k, None) for k in TLS_KEYS]
    if all(given):
        return Security(require_encryption=True), f"dask's configuration `distributed.comm.tls.*` ({DASK_SOURCES})"
    if address.startswith("tls://"):
        raise ReleaseError(f"the dask scheduler {address} takes TLS, and neither the operator's dask_tls_* settings "
                           f"({settings.env_of('dask_tls_ca_file')}, _CERT, _KEY) nor dask's configuration "
                           f"({', '.join(TLS_KEYS)}) give its CA, certificate and key")
    return None, "none (tcp://)"
