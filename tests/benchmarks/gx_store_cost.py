"""What keeping a dataset's great-expectations project on an object store costs: one whole-table contract check
(`run_checkpoint`: suite, validation definition, checkpoint, stored result) and the Data Docs build of its release
(`build_docs`), on a local project and on the same project kept in an S3 API (moto's server on loopback: a real S3
protocol, no network latency, so a real bucket costs more per request).

    python tests/benchmarks/gx_store_cost.py --releases 6
Prints per project: RESULT gx_project=<local|s3> first_s=<first check + build> median_s=<median of the later ones>
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", type=int, default=6, help="releases recorded into each project")
    parser.add_argument("--rows", type=int, default=1000)
    args = parser.parse_args()
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update({"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "bench",
                       "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"})
    try:
        import boto3
        import great_expectations.expectations as gxe
        import numpy as np
        import pandas as pd

        from data_contracts.gx_run import GxRun
        from data_contracts.project import build_docs, run_checkpoint

        boto3.client("s3").create_bucket(Bucket="private")
        frame = pd.DataFrame({"x": np.random.default_rng(0).uniform(0, 1, args.rows)})
        expectations = [gxe.ExpectColumnValuesToBeBetween(column="x", min_value=0, max_value=1),
                        gxe.ExpectTableRowCountToEqual(value=args.rows)]
        for where in ("local", "s3"):
            root = Path(tempfile.mkdtemp()) / "d"
            seconds = []
            for i in range(args.releases):
                run = GxRun(root, "d", "histogram", f"r{i}", "s3://private/gx/d" if where == "s3" else None)
                start = time.perf_counter()
                run_checkpoint(run, "release", expectations, frame)
                build_docs(run)
                seconds.append(time.perf_counter() - start)
            print(f"RESULT gx_project={where} first_s={seconds[0]:.2f} median_s={statistics.median(seconds[1:]):.2f}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
