"""Where the pipeline reads and writes. A location is a local path or an fsspec URL (`s3://`, `gs://`, `abfs://`,
`file://`); every function here takes one as a string and works alike on both, so that dask workers on hosts that
share no disk read and write the same locations as the driver.

Three kinds of location, each the operator's (docs/design.md, "Scale and where the data lives"): a dataset's source
(read only, bound to its dataset id by the ledger, identified by its objects' versions or ETags), the private scratch
location of the raw-derived stage outputs every worker must read (`scratch`), and the public output location of the
releases and their catalogue (`output`). Credentials never come from a spec, a log line or a manifest: each store's
standard environment gives them (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, `GOOGLE_APPLICATION_CREDENTIALS`,
`AZURE_STORAGE_*`) on every host, or fsspec's configuration of the process, which the operator's Prefect credentials
block or `dprelease query --storage-options` fill (`options.py`).
"""

# The schemes live below this package and the operator's settings, which check a configured location with them.
from tasks.schemes import EXTRAS, SCHEMES, check_supported
from tasks.storage.io import (
                              copy_into,
                              digest,
                              download,
                              exists,
                              file_sha256,
                              files,
                              filesystem,
                              identity,
                              is_dir,
                              makedirs,
                              on_store,
                              probe,
                              read_bytes,
                              read_table,
                              remove,
                              store_failure,
                              unreachable_message,
                              upload,
                              write_batches,
                              write_bytes,
                              write_table,
)
from tasks.storage.locations import (
                              canonical,
                              is_url,
                              join,
                              name,
                              parent,
                              relative,
                              within,
)
from tasks.storage.options import configure

__all__ = ["EXTRAS", "SCHEMES", "canonical", "check_supported", "configure", "copy_into", "digest",
           "download", "exists", "file_sha256", "files", "filesystem", "identity", "is_dir", "is_url", "join",
           "makedirs", "name", "on_store", "parent", "probe", "read_bytes", "read_table", "relative",
           "remove", "store_failure", "unreachable_message", "upload", "within", "write_batches", "write_bytes",
           "write_table"]
