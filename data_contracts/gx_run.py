"""Where one release records its contract results (`GxRun`): the dataset's great-expectations project and its Data
Docs site. Below both data_contracts/project.py (which opens and writes the project) and data_contracts/validate.py
(which takes a run to record into)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SITE = "local_site"
#: The site's files, relative to a project folder.
SITE_DIR = Path("gx") / "uncommitted" / "data_docs" / SITE
#: Where the Data Docs site of a project on an object store lives, below the project's URL (`GxRun.store`).
DATA_DOCS_PREFIX = "data_docs"


@dataclass(frozen=True)
class GxRun:
    """Where one release records its contract results: the dataset's project folder, the names of its suites and
    the run name (the release id). With `store` (a URL), the project's stores and Data Docs live there, every
    host's, and `root` holds only this host's config, plugins and lock (data_contracts/object_store.py)."""
    root: Path
    dataset: str
    kind: str
    release_id: str
    store: str | None = None

    def suite(self, stage: str) -> str:
        return f"{self.kind}.{stage}"

    @property
    def index(self) -> Path | str:
        if self.store is not None:
            return f"{self.store}/{DATA_DOCS_PREFIX}/index.html"
        return self.root / SITE_DIR / "index.html"
