"""Make docs/gx-data-docs-index.png (the Data Docs index of the built-in example's dataset after two releases) and
docs/gx-data-docs-result.png (the normalised stage's validation result of the second).

    python docs/gx_screenshot.py [--out-dir docs]

Runs `dprelease run --example --no-evaluate` twice into a temporary folder (its own ledger and temporary Prefect API
server, as the example always does), then opens the pages from disk in headless Chromium (`apt install chromium`)
with no network: what they show is what an offline host shows. Everything is removed afterwards.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def shoot(browser: str, page: Path, out: Path, width: int, height: int) -> None:
    subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={width},{height}", f"--screenshot={out}", page.as_uri()],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", default=str(REPO / "docs"))
    args = parser.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        sys.exit("error: no headless Chromium found (apt install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        for release_id in ("example-sensors-docs-1", "example-sensors-docs-2"):
            subprocess.run([sys.executable, "-m", "flows.cli", "run", "--example", "--no-evaluate", "--release-id",
                            release_id, "--output-dir", f"{tmp}/runs"], cwd=REPO, check=True)
        site = Path(tmp) / "runs" / ".gx" / "example-sensors" / "gx" / "uncommitted" / "data_docs" / "local_site"
        shoot(browser, site / "index.html", Path(args.out_dir) / "gx-data-docs-index.png", 1400, 1000)
        [result] = (site / "validations" / "kmeans" / "normalised" / "example-sensors-docs-2").glob("*/*.html")
        shoot(browser, result, Path(args.out_dir) / "gx-data-docs-result.png", 1400, 1300)


if __name__ == "__main__":
    main()
