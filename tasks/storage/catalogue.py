"""The public output location: where each release is published, and the catalogue of the releases there.

With the operator's `output` setting, a release of dataset D and kind K is published at
`<output>/dataset=D/kind=K/release=<release id>/` (hive-style: every release of one dataset and kind reads as one
table, `read_parquet('<output>/dataset=D/kind=K/*/histogram.parquet', hive_partitioning=true)`), its manifest written
last (an object store has no atomic rename: a release exists where its manifest is). Without it, a release stays where
a local run always put it, `<output_dir>/<release id>/release/`, and the output location is `<output_dir>`.

Each output location keeps a catalogue, `<output>/catalogue/release=<release id>.parquet`: one row per published
release, written after its manifest (a row names a release that exists), one file per release so that releases
published at once never write the same object. DuckDB (`read_parquet('<output>/catalogue/*.parquet')`) and polars
(`pl.read_parquet('<output>/catalogue/*.parquet')`) read them as one table.
"""

from __future__ import annotations

from pathlib import Path

from tasks import settings
from tasks.errors import Refused
from tasks.storage.io import exists, files, probe, read_table, write_table
from tasks.storage.locations import canonical, is_url, join

CATALOGUE = "catalogue"
#: The version of the released files' layout and metadata (their key-value metadata names it).
SCHEMA_VERSION = "1"
COLUMNS = ("release_id", "dataset_id", "kind", "period", "epsilon", "delta", "published_at", "manifest_sha256",
           "location", "files")


def output_location(output_dir: str) -> str:
    """The public output location: the operator's `output`, else the spec's `output_dir`."""
    return settings.current().output or canonical(output_dir)


def release_location(output_dir: str, dataset_id: str, kind: str, release_id: str) -> str:
    """Where the release is published (see the module docstring)."""
    output = settings.current().output
    if output is None:
        return str(Path(canonical(output_dir)) / release_id / "release")
    return join(output, f"dataset={dataset_id}", f"kind={kind}", f"release={release_id}")


def table_location(output_dir: str, dataset_id: str, kind: str) -> str:
    """Where every release of one dataset and kind reads as one table, `<output>/dataset=D/kind=K` (the lineage's
    stable asset). Without the `output` setting no folder holds them together (each stays in its run folder): the
    same form under `output_dir` then names the table, for the lineage only."""
    return join(output_location(output_dir), f"dataset={dataset_id}", f"kind={kind}")


def add(output: str, row: dict) -> str:
    """The catalogue row of a published release (after its manifest); returns where it was written."""
    import pyarrow as pa

    table = pa.table({c: [row[c]] for c in COLUMNS}, schema=pa.schema([
        ("release_id", pa.string()), ("dataset_id", pa.string()), ("kind", pa.string()), ("period", pa.string()),
        ("epsilon", pa.float64()), ("delta", pa.float64()), ("published_at", pa.string()),
        ("manifest_sha256", pa.string()), ("location", pa.string()), ("files", pa.list_(pa.string()))]))
    where = join(output, CATALOGUE, f"release={row['release_id']}.parquet")
    write_table(table, where, {"dprelease.schema_version": SCHEMA_VERSION})
    return where


def check_output_location(output: str, what: str = "--output") -> None:
    """Refuse, in one line, what cannot be an output location: a missing folder, a file, a store that does not
    answer. (`releases list` said "0 releases" of all three.) A folder or a store's prefix without a catalogue is
    one: nothing was published there yet. A store's prefix exists once objects are under it, so only its store is
    asked."""
    if is_url(output):
        probe(output)  # raises Unreachable for a store that does not answer or refuses the credentials
        return
    path = Path(output)
    if not path.exists():
        raise Refused(f"{what}: {output} does not exist: not an output location (the folder runs write to, or the "
                      f"operator's `output` setting)")
    if not path.is_dir():
        raise Refused(f"{what}: {output} is a file, not an output location (a folder, or a store's URL)")


def row_from_manifest(manifest: dict, public: str) -> dict:
    """The catalogue row of the release whose manifest this is, published at `public`."""
    return {"release_id": manifest["release_id"], "dataset_id": manifest["dataset_id"], "kind": manifest["kind"],
            "period": manifest.get("period"), "epsilon": manifest["privacy"]["epsilon"],
            "delta": manifest["privacy"]["delta"], "published_at": manifest["created_at"],
            "manifest_sha256": manifest["manifest_sha256"]["sha256"], "location": public,
            "files": [join(public, f) for f in sorted(manifest["files"])] + [join(public, "manifest.json")]}


def row_of(output: str, release_id: str) -> dict | None:
    """The catalogue row of one release, or None."""
    where = join(output, CATALOGUE, f"release={release_id}.parquet")
    if not exists(where):
        return None
    found = read_table(where).to_pylist()
    return found[0] if found else None


def rows(output: str, dataset_id: str | None = None) -> list[dict]:
    """The catalogue of an output location (its releases, oldest first), of one dataset or all."""
    folder = join(output, CATALOGUE)
    if not exists(folder):
        return []
    found = [r for f in files(folder, ".parquet") for r in read_table(f).to_pylist()]
    return sorted((r for r in found if dataset_id is None or r["dataset_id"] == dataset_id),
                  key=lambda r: (r["published_at"], r["release_id"]))
