"""The stores a location may name: URL schemes, the fsspec package that serves each, and the check of one location's
scheme. Pure string work below both the operator's settings (which check a configured location when they are read)
and the storage package (which reads and writes locations): both import it, it imports neither."""

from __future__ import annotations

import importlib.util
import re

from tasks.errors import Refused

#: URL scheme -> the fsspec filesystem package that serves it (None: the local disk).
SCHEMES = {"file": None, "s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "abfs": "adlfs", "az": "adlfs"}
#: The filesystem package -> the optional extra that installs it (`pip install "dprelease[s3]"`).
EXTRAS = {"s3fs": "s3", "gcsfs": "gcs", "adlfs": "azure"}

URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")


def is_url(location: str) -> bool:
    """A URL of a store (file:// URLs are local paths)."""
    match = URL.match(str(location))
    return bool(match) and match.group(1).lower() != "file"


def check_supported(location: str, what: str = "location") -> None:
    """Refuse (one line) a URL whose scheme no supported store serves, or whose filesystem package is not installed,
    before anything runs."""
    match = URL.match(location)
    if not match:
        return
    scheme = match.group(1).lower()
    if scheme not in SCHEMES:
        raise Refused(f"{what}: the scheme {scheme}:// is not supported (local paths and "
                      f"{', '.join(s + '://' for s in SCHEMES)})")
    package = SCHEMES[scheme]
    if package is not None and importlib.util.find_spec(package) is None:
        raise Refused(f"{what}: {scheme}:// needs the {package} package: pip install \"dprelease[{EXTRAS[package]}]\"")
    if scheme != "file" and not match.group(2).split("/")[0]:
        raise Refused(f"{what}: {location} names no bucket or container")
    if ".." in match.group(2).split("/"):
        raise Refused(f"{what}: {location} has a '..' in its path")
