"""Reading a spec file: YAML or JSON holding a mapping, with one text per way it can fail, each naming the file and
at most a line and a column (a parser's own text quotes the line it could not read: a spec file argument pointing at
a private CSV would print a record). A key given twice in one mapping is refused: YAML keeps the last silently, so
`epsilon: 0.5` followed by `epsilon: 5` released at 5."""

from __future__ import annotations

from pathlib import Path

import yaml

DUPLICATE = "a key is given twice in one mapping (YAML would keep the last one silently)"


class _UniqueKeys(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that gives one key twice."""


def _mapping(loader: _UniqueKeys, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:  # an unhashable key: the constructor's own error says so
            break
        if duplicate:
            raise yaml.constructor.ConstructorError(None, None, DUPLICATE, key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


class SpecFileError(ValueError):
    """A spec file that cannot be read as a mapping; the text names the file and a line and column at most."""


def read_mapping(path: str | Path) -> dict:
    """The mapping in the spec file at `path`, or a `SpecFileError` (or FileNotFoundError for a missing file)."""
    path = Path(path)
    try:
        data = yaml.load(path.read_text(), Loader=_UniqueKeys)  # a SafeLoader: no Python objects
    except FileNotFoundError:
        raise
    except yaml.MarkedYAMLError as exc:  # its text quotes the line it could not read: line and column only
        mark = exc.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        if exc.problem == DUPLICATE:  # not the key itself: the file may be anything a caller named
            raise SpecFileError(f"spec file {path}: {DUPLICATE}{where}") from None
        raise SpecFileError(f"spec file {path} is not valid YAML/JSON{where}") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SpecFileError(f"spec file {path} cannot be read as YAML/JSON: {type(exc).__name__}") from None
    except RecursionError:  # the parser recurses once per level: a few hundred levels exhaust Python's stack
        raise SpecFileError(f"spec file {path} is nested too deeply to be read as a release spec") from None
    if not isinstance(data, dict):
        raise SpecFileError(f"spec file {path} must hold a mapping at top level")
    return data
