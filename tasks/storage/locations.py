"""Locations as strings: a local path, or a URL of a supported store. Pure string work (no filesystem touched, no
store contacted): the checks before a run ask these, before any existence is asked. Which stores a URL may name is
`tasks.schemes`, below this package."""

from __future__ import annotations

import posixpath
from pathlib import Path

from tasks.schemes import URL, is_url


def canonical(location: str) -> str:
    """The location as the ledger binds it and every stage reads it: a local path made absolute and resolved (symlinks
    included; file:// URLs are local paths), or a URL with its scheme in lower case and no empty or trailing parts."""
    match = URL.match(location)
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
