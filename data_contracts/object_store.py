"""A great-expectations store backend on an object store, through fsspec: the dataset project's expectation suites,
validation definitions, checkpoints, validation results and Data Docs site in the operator's bucket, so that every
worker host records into, and reads, one history of the dataset.

GX Core 1.x removed its own cloud backends (`TupleS3StoreBackend`, `TupleGCSStoreBackend`,
`TupleAzureBlobStoreBackend`: "thin wrappers around the cloud SDK", its maintainers said) and keeps the
`TupleStoreBackend` contract, which a project's config may name by `module_name` and `class_name`. This is that
contract over fsspec: the same keys and file layout as great-expectations' `TupleFilesystemStoreBackend`, under a URL
(`s3://bucket/prefix`, `gs://`, `abfs://`) instead of a folder. Credentials and endpoint are fsspec's configuration
and each store's standard environment, as for every other read and write of the pipeline (the operator's
credentials block fills fsspec's configuration: tasks/storage/options.py); nothing of them is written in the
project's config.
"""

from __future__ import annotations

from great_expectations.data_context.store.tuple_store_backend import TupleStoreBackend
from great_expectations.exceptions import InvalidKeyError, StoreBackendError


class FsspecStoreBackend(TupleStoreBackend):
    """great-expectations' tuple store at the URL `base_url` (see the module docstring)."""

    def __init__(self, base_url: str, filepath_template=None, filepath_prefix=None, filepath_suffix=None,
                 forbidden_substrings=None, platform_specific_separator=False, root_directory=None,
                 fixed_length_key=False, suppress_store_backend_id=False,
                 manually_initialize_store_backend_id: str = "", base_public_path=None, store_name=None) -> None:
        super().__init__(filepath_template=filepath_template, filepath_prefix=filepath_prefix,
                         filepath_suffix=filepath_suffix, forbidden_substrings=forbidden_substrings,
                         platform_specific_separator=False,  # keys are "/"-separated on every store
                         fixed_length_key=fixed_length_key, suppress_store_backend_id=suppress_store_backend_id,
                         manually_initialize_store_backend_id=manually_initialize_store_backend_id,
                         base_public_path=base_public_path, store_name=store_name)
        self.base_url = base_url.rstrip("/")
        self._config = {k: v for k, v in {
            "base_url": self.base_url, "filepath_template": filepath_template, "filepath_prefix": filepath_prefix,
            "filepath_suffix": filepath_suffix, "forbidden_substrings": forbidden_substrings,
            "fixed_length_key": fixed_length_key, "suppress_store_backend_id": suppress_store_backend_id,
            "manually_initialize_store_backend_id": manually_initialize_store_backend_id,
            "base_public_path": base_public_path, "store_name": store_name,
            "module_name": self.__class__.__module__, "class_name": self.__class__.__name__}.items() if v}
        if not self._suppress_store_backend_id:
            _ = self.store_backend_id

    def _filesystem(self):
        """(fsspec filesystem, the base URL's path on it); fsspec caches the filesystem per store and options."""
        import fsspec

        return fsspec.core.url_to_fs(self.base_url)

    def _path(self, key) -> tuple:
        fs, root = self._filesystem()
        return fs, f"{root}/{self._convert_key_to_filepath(key)}"

    def _get(self, key):
        fs, path = self._path(key)
        try:
            return fs.cat_file(path).decode("utf-8").rstrip("\n")
        except FileNotFoundError:
            pass
        fs.invalidate_cache(path.rsplit("/", 1)[0])  # "missing" may be a cached listing's word: ask the store
        try:
            return fs.cat_file(path).decode("utf-8").rstrip("\n")
        except FileNotFoundError:
            raise InvalidKeyError(f"{self.base_url}: no object for the key {key}") from None

    def _get_all(self) -> list:
        return [self._get(k) for k in self.list_keys() if k != self.STORE_BACKEND_ID_KEY]

    def _set(self, key, value, **kwargs):
        if not isinstance(key, tuple):
            key = key.to_tuple()
        fs, path = self._path(key)
        fs.pipe_file(path, value.encode("utf-8") if isinstance(value, str) else value)
        return f"{self.base_url}/{self._convert_key_to_filepath(key)}"

    def _move(self, source_key, dest_key, **kwargs):
        fs, source = self._path(source_key)
        if not fs.exists(source):
            return False
        fs.mv(source, self._path(dest_key)[1])
        return dest_key

    def list_keys(self, prefix: tuple = ()) -> list:
        """Every key under `prefix`, listed afresh: a long-lived process (a worker serving many runs) would otherwise
        list from fsspec's cached listing, without what other hosts wrote since (the Data Docs index is built from
        this list)."""
        fs, root = self._filesystem()
        base = "/".join([root, *prefix])
        fs.invalidate_cache(base)
        found = fs.find(base) if fs.exists(base) else []
        keys = []
        for path in found:
            relative = path[len(root):].lstrip("/")
            if self._is_missing_prefix_or_suffix(filepath_prefix=self.filepath_prefix,
                                                 filepath_suffix=self.filepath_suffix, key=relative):
                continue
            key = self._convert_filepath_to_key(relative)
            if key and not self.is_ignored_key(key):
                keys.append(key)
        return keys

    def remove_key(self, key):
        if not isinstance(key, tuple):
            key = key.to_tuple()
        fs, path = self._path(key)
        if not fs.exists(path):
            return False
        fs.rm(path)
        return True

    def _has_key(self, key):
        fs, path = self._path(key)
        fs.invalidate_cache(path.rsplit("/", 1)[0])  # another host may have written it since this process listed
        return fs.isfile(path)

    def get_url_for_key(self, key, protocol=None) -> str:
        return f"{self.base_url}/{self._url_path_escape_special_characters(self._convert_key_to_filepath(key))}"

    def get_public_url_for_key(self, key, protocol=None):
        if not self.base_public_path:
            raise StoreBackendError(f"{self.base_url}: no base_public_path configured")
        return self.base_public_path + self._convert_key_to_filepath(key)

    @property
    def config(self) -> dict:
        return self._config
