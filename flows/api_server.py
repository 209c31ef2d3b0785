"""The process of a run's temporary Prefect API server (flows/api.py starts it):

    python -m flows.api_server PORT

What Prefect's ephemeral server runs (`python -m uvicorn --factory prefect.server.api.server:create_app --host
127.0.0.1 --port PORT --log-level error --lifespan on`, with the environment flags flows/api.py sets), with one
difference: the cyclic garbage collector is paused while Prefect's server loads and builds its app, then told to
leave what that made alone. Loading makes millions of objects and few cycles: the boot took 2.5-2.7 s of CPU with
the collector, 2.0-2.1 s without (measured 2026-11-26), and the boot is what a run waits for. uvicorn exits with
code 3 when it cannot start (its port taken), as from its command line.
"""

from __future__ import annotations

import gc
import sys


def main(port: int) -> None:
    gc.disable()
    import uvicorn
    from prefect.server.api.server import create_app

    app = create_app()
    gc.freeze()
    gc.enable()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error", lifespan="on")


if __name__ == "__main__":
    main(int(sys.argv[1]))
