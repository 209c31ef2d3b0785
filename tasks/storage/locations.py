"""Locations as strings: a local path, or a URL of a supported store. Pure string work (no filesystem touched, no
store contacted): the checks before a run ask these, before any existence is asked."""

from __future__ import annotations

import importlib.util
import posixpath
import re
from pathlib import Path

from tasks.errors import Refused

#: URL scheme -> the fsspec filesystem package that serves it (None: the local disk).
SCHEMES = {"file": None, "s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "abfs": "adlfs", "az": "adlfs"}
#: The filesystem package -> the optional extra that installs it (`pip install "dprelease[s3]"`).
EXTRAS = {"s3fs": "s3", "gcsfs": "gcs", "adlfs": "azure"}

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")


def is_url(location: str) -> bool:
    """A URL of a store (file:// URLs are local paths)."""
    match = _URL.match(str(location))
    return bool(match) and match.group(1).lower() != "file"


def check_supported(location: str, what: str = "location") -> None:
    """Refuse (one line) a URL whose scheme no supported store serves, or whose filesystem package is not installed,
    before anything runs."""
    match = _URL.match(location)
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


def canonical(location: str) -> str:
    """The location as the ledger binds it and every stage reads it: a local path made absolute and resolved (symlinks
    included; file:// URLs are local paths), or a URL with its scheme in lower case and no empty or trailing parts."""
    match = _URL.match(location)
    if match is None or match.group(1).lower() == "file":
        path = location if match is None else match.group(2)
        return str(Path(path).expanduser().resolve())
    scheme, rest = match.group(1).lower(), match.group(2)
    parts = [p for p in rest.split("/") if p not in ("", ".")]
    return f"{scheme}://" + "/".join(parts)


def within(location: str, bound: str) -> bool:
    """`location` is `bound` or inside it (both canonical)."""
    if location == bound:
        return True
    if is_url(bound) != is_url(location):
        return False
    if is_url(bound):
        return location.startswith(bound.rstrip("/") + "/")
    return Path(bound) in Path(location).parents


def join(location: str, *parts: str) -> str:
    if is_url(location):
        return "/".join([location.rstrip("/"), *(p.strip("/") for p in parts)])
    return str(Path(location).joinpath(*parts))


def parent(location: str) -> str:
    return location.rsplit("/", 1)[0] if is_url(location) else str(Path(location).parent)


def name(location: str) -> str:
    return location.rstrip("/").rsplit("/", 1)[-1] if is_url(location) else Path(location).name


def relative(location: str, root: str) -> str:
    """`location`'s path below `root` (which it is within)."""
    if is_url(root):
        return posixpath.relpath(location, root) if location != root else name(location)
    return str(Path(location).relative_to(root)) if location != root else Path(location).name
