"""Reading and writing locations (local paths or store URLs, `tasks.storage.locations`). Local paths go through the
standard library and pyarrow as before; URLs through fsspec (imported on first use: a store's package takes a second
to load), with each store's credentials from the standard environment of the process, on every host.

Every operation on a store is retried while the store refuses, drops or times out connections, with backoff, for the
operator's `outage_retry_seconds` (`tasks.transient`), then fails with one line naming the store: a store restarted
under a running release delays it instead of failing it. A write retried writes the same object again.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from tasks.storage.locations import is_url, join, relative
from tasks.storage.options import configure
from tasks.transient import connection_error, retried

if TYPE_CHECKING:
    import pyarrow as pa


def _store(fn):
    """Retry the operation on a store's location (its first argument a URL, or its second: `_put`) through an
    outage; local paths as they are."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        location = next((a for a in args[:2] if isinstance(a, str) and is_url(a)), None)
        if location is None:
            return fn(*args, **kwargs)
        return retried(lambda: fn(*args, **kwargs), f"the object store {store_of(location)}", connection_error)
    return call


def on_store(fn):
    """`fn(src, dst, ...)` retried as a whole through a store's outage when either location is a URL: for work that
    streams a file into another (`read_batches`, `write_batches`), where a retry must start the file again."""
    return _store(fn)


def store_of(location: str) -> str:
    """A store's URL as messages name it: its scheme and bucket (or container)."""
    scheme, rest = location.split("://", 1)
    return f"{scheme}://{rest.split('/', 1)[0]}"


def filesystem(location: str):
    """(fsspec filesystem, its path) of a URL; fsspec caches one filesystem per store and options (the operator's
    credentials block among them: `tasks.storage.options`)."""
    import fsspec

    configure()
    return fsspec.core.url_to_fs(location)


#: How long the checks before anything runs wait for a store (`probe`): a connection, then each answer, one attempt.
#: With the clients' defaults (60 s a read, botocore's 5 attempts, s3fs's 5 retries) a silent endpoint (one that
#: accepts connections and never answers) held `dprelease run` and `releases list` for over 5 minutes.
PROBE_CONNECT_SECONDS, PROBE_READ_SECONDS = 5.0, 5.0
#: The packages whose exceptions say that a store did not answer or refused the request (no credentials, a refused
#: connection, a timeout, an unknown bucket): their texts are the store's, never the data's.
STORE_PACKAGES = ("botocore", "aiobotocore", "boto3", "aiohttp", "s3fs", "gcsfs", "adlfs", "azure", "google",
                  "fsspec")


def store_failure(exc: BaseException) -> bool:
    """Whether `exc` is a store's client saying the store cannot be reached or refused the request."""
    return isinstance(exc, TimeoutError) or any(t.__module__.split(".")[0] in STORE_PACKAGES for t in type(exc).__mro__)


def unreachable_message(location: str, exc: BaseException) -> str:
    """One line for a store that cannot be reached: the location, the exception's type (its text may be long and
    names endpoints and keys), where credentials come from."""
    return (f"{location} cannot be reached ({type(exc).__name__}): credentials and endpoint come from the store's "
            f"standard environment (e.g. AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL) or the "
            f"operator's Prefect block (DPRELEASE_AWS_CREDENTIALS_BLOCK). Nothing was run")


def probe(location: str) -> bool:
    """Whether `location` exists, asked with short timeouts and one attempt (`PROBE_CONNECT_SECONDS`,
    `PROBE_READ_SECONDS`): the checks before anything runs use it. A store that does not answer, or refuses the
    credentials, raises `tasks.errors.Unreachable` naming the location, in seconds rather than minutes."""
    from tasks.errors import Unreachable

    if not is_url(location):
        return Path(location).exists()
    try:
        fs, path = _probe_filesystem(location)
        return fs.exists(path)
    except Exception as exc:
        if store_failure(exc) or isinstance(exc, OSError):
            raise Unreachable(unreachable_message(location, exc)) from None
        raise


def _probe_filesystem(location: str):
    import fsspec

    scheme = location.split("://", 1)[0].lower()
    if scheme != "s3":
        return filesystem(location)
    configure()
    fs = fsspec.filesystem("s3", skip_instance_cache=True, config_kwargs={
        "connect_timeout": PROBE_CONNECT_SECONDS, "read_timeout": PROBE_READ_SECONDS,
        "retries": {"max_attempts": 1, "mode": "standard"}})
    fs.retries = 1  # s3fs's own retries of a timed-out request (its default: 5), on this instance only
    return fs, fs._strip_protocol(location)


@_store
def exists(location: str) -> bool:
    if not is_url(location):
        return Path(location).exists()
    fs, path = filesystem(location)
    return fs.exists(path)


@_store
def is_dir(location: str) -> bool:
    if not is_url(location):
        return Path(location).is_dir()
    fs, path = filesystem(location)
    return fs.isdir(path)


@_store
def files(location: str, suffix: str = "") -> list[str]:
    """Every file at or under `location` whose name ends with `suffix`, in order (a file: itself)."""
    if not is_url(location):
        root = Path(location)
        found = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        return [str(p) for p in found if p.name.endswith(suffix)]
    fs, path = filesystem(location)
    scheme = location.split("://", 1)[0]
    if not fs.isdir(path):
        return [location]
    return [f"{scheme}://{p}" for p in sorted(fs.find(path)) if p.endswith(suffix)]


@_store
def identity(location: str) -> list[list]:
    """What identifies the content of every file at or under `location` without reading it: on a store, each object's
    path, size and version id or ETag (an object's identity, never its modification time); on a local disk, each
    file's path, size, modification and change times and inode (a file replaced by `cp -p` keeps its size and mtime,
    not its ctime)."""
    if not is_url(location):
        root = Path(location)
        if not root.exists():
            return []
        found = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        return [[str(p.relative_to(root)) if root.is_dir() else p.name, st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                 st.st_ino] for p in found for st in [p.stat()]]
    fs, path = filesystem(location)
    if not fs.exists(path):
        return []
    infos = [fs.info(p) for p in (sorted(fs.find(path)) if fs.isdir(path) else [path])]
    return [[relative(i["name"], path) if i["name"] != path else i["name"].rsplit("/", 1)[-1], i.get("size"),
             i.get("VersionId") or i.get("ETag") or i.get("etag") or i.get("md5Hash") or i.get("generation")]
            for i in infos]


def digest(location: str) -> str | None:
    """What a location holds, whatever its path: a local file's sha256, a local folder's digest manifest (each file's
    path below it and sha256), or a store's digest manifest of its objects' paths, sizes and versions or ETags (the
    store's own content identity: reading terabytes back to hash them is not an option); None where there is nothing
    to compare (missing, or an empty folder)."""
    if not is_url(location):
        path = Path(location)
        if not path.exists():
            return None
        if path.is_file():
            return file_sha256(path)
        found = [f for f in sorted(path.rglob("*")) if f.is_file()]
        manifest = "".join(f"{f.relative_to(path)}\t{file_sha256(f)}\n" for f in found)
        return hashlib.sha256(manifest.encode()).hexdigest() if found else None
    objects = identity(location)
    single = not is_dir(location)  # one object: its content, whatever its key
    manifest = "".join(f"{'' if single else rel}\t{size}\t{version}\n" for rel, size, version in objects)
    return hashlib.sha256(manifest.encode()).hexdigest() if objects else None


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@_store
def read_bytes(location: str) -> bytes:
    if not is_url(location):
        return Path(location).read_bytes()
    fs, path = filesystem(location)
    return fs.cat_file(path)


@_store
def write_bytes(location: str, data: bytes) -> None:
    if not is_url(location):
        Path(location).parent.mkdir(parents=True, exist_ok=True)
        Path(location).write_bytes(data)
        return
    fs, path = filesystem(location)
    fs.pipe_file(path, data)


def makedirs(location: str) -> None:
    """A folder (a local one; a store has no folders: objects make their prefixes)."""
    if not is_url(location):
        Path(location).mkdir(parents=True, exist_ok=True)


@_store
def remove(location: str) -> None:
    """Remove a file or a folder (a prefix of objects), if there."""
    if not is_url(location):
        path = Path(location)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        return
    fs, path = filesystem(location)
    if fs.exists(path):
        fs.rm(path, recursive=True)


@_store
def read_table(location: str, columns: list[str] | None = None) -> pa.Table:
    import pyarrow.parquet as pq

    if not is_url(location):
        return pq.read_table(location, columns=columns)
    fs, path = filesystem(location)
    return pq.read_table(path, columns=columns, filesystem=fs)


@_store
def write_table(table: pa.Table, location: str, metadata: dict | None = None) -> None:
    """Write a Parquet file; `metadata` (str -> str) goes into its key-value metadata."""
    import pyarrow.parquet as pq

    if metadata:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **{k.encode(): v.encode()
                                                                                  for k, v in metadata.items()}})
    if not is_url(location):
        Path(location).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, location)
        return
    fs, path = filesystem(location)
    pq.write_table(table, path, filesystem=fs)


def write_batches(tables: Iterable[pa.Table], location: str) -> None:
    """One Parquet file of the tables in order (at least one), a row group each. Floating-point columns are written
    plain, without dictionary encoding, which measured values seldom repeat enough to pay for (16 ns a value to write
    against 6); integer columns (a bin or cell index) delta-encoded: 1.43 bytes a value for 1,024 bins, about the
    dictionary's 1.26, written in 21-30 ns against its 43-54 (the dictionary's write was 3.5 s of the 10^8-record
    histogram's 10 s of worker time in `encoded`); other columns (text) keep the dictionary. pyarrow 26,
    2026-11-29, 2 shared cores."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = iter(tables)
    first = next(tables)
    delta = {f.name: "DELTA_BINARY_PACKED" for f in first.schema if pa.types.is_integer(f.type)}
    coded = [f.name for f in first.schema if not pa.types.is_floating(f.type) and f.name not in delta]
    fs, path = (None, location) if not is_url(location) else filesystem(location)
    if fs is None:
        Path(location).parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(path, first.schema, filesystem=fs, use_dictionary=coded,
                          column_encoding=delta or None) as writer:
        writer.write_table(first, row_group_size=max(first.num_rows, 1))
        for table in tables:
            writer.write_table(table, row_group_size=max(table.num_rows, 1))


def upload(folder: Path, location: str, last: str | None = None, written: list[str] | None = None) -> list[str]:
    """Every file of a local folder to the same paths under `location` (a store's prefix or a local folder), the file
    named `last` after all the others: a reader that finds it finds everything (object stores have no atomic rename).
    Returns the locations written, also appended to `written` as they are (what a failure must remove)."""
    written = [] if written is None else written
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != last):
        written.append(_put(f, join(location, str(f.relative_to(folder)))))
    if last is not None and (folder / last).exists():
        written.append(_put(folder / last, join(location, last)))
    return written


@_store
def _put(source: Path, location: str) -> str:
    if not is_url(location):
        Path(location).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, location)
    else:
        fs, path = filesystem(location)
        fs.put_file(str(source), path)
    return location


def download(location: str, folder: Path) -> None:
    """Every file at or under `location` into a local folder, at the same relative paths."""
    for f in files(location):
        target = folder / (relative(f, location) if f != location else Path(f).name)
        target.parent.mkdir(parents=True, exist_ok=True)
        if is_url(f):
            _get(f, str(target))
        else:
            shutil.copyfile(f, target)


@_store
def _get(location: str, target: str) -> None:
    fs, path = filesystem(location)
    fs.get_file(path, target)


def copy_into(location: str, folder: Path) -> Path:
    """A private local copy of a file or folder (a public input read from a checked copy): returns its path."""
    target = folder / location.rstrip("/").rsplit("/", 1)[-1] if is_url(location) else folder / Path(location).name
    if is_url(location) and is_dir(location) or not is_url(location) and Path(location).is_dir():
        download(location, target)
    elif is_url(location):
        folder.mkdir(parents=True, exist_ok=True)
        _get(location, str(target))
    else:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(location, target)
    os.chmod(target, 0o700 if target.is_dir() else 0o600)
    return target
