"""Base model and the loader that turns validation errors into JSON-path messages."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError

from shared.errors import FormatError

NonEmptyStr = Annotated[str, StringConstraints(min_length=1)]

ModelT = TypeVar("ModelT", bound=BaseModel)
_PLAIN_KEY = re.compile(r"[\w-]+")


class Frozen(BaseModel):
    """Every boundary model: immutable, and an unknown field is an error."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def json_path(loc: tuple[Any, ...], data: Any) -> str:
    """`("axes", "M", "typo")` -> `$.axes.M.typo`; list indices become `[i]`.

    Pydantic puts the tag of a discriminated union (`random`, `const`...) into the location;
    walking the input alongside drops those entries, so the path names real JSON keys only.
    """
    path = "$"
    node = data
    for part in loc:
        if isinstance(node, dict) and part not in node and node.get("type") == part:
            continue
        path = child_path(path, part)
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            node = None
    return path


def child_path(path: str, part: str | int) -> str:
    """`$.axes` + `M` -> `$.axes.M`; an index -> `[i]`; a key that is not a plain word (spaces, dots,
    newlines, brackets...) -> `["a key"]`, escaped as JSON so a message stays one line."""
    if isinstance(part, int):
        return f"{path}[{part}]"
    if _PLAIN_KEY.fullmatch(part):
        return f"{path}.{part}"
    return f"{path}[{json.dumps(part)}]"


def shown(text: str, limit: int = 80) -> str:
    """User text as a message shows it: as is when printable and short, else escaped as JSON
    (one line, no lone surrogates) and cut at `limit` characters."""
    if text.isprintable() and len(text) <= limit:
        return text
    quoted = json.dumps(text[:limit])
    return quoted if len(text) <= limit else f"{quoted} (+{len(text) - limit} characters)"


def format_validation_error(error: ValidationError, data: Any, source: str) -> str:
    lines = []
    for item in error.errors():
        message = item["msg"]  # may quote the input: kept to one line of printable text
        message = message if message.isprintable() else json.dumps(message)[1:-1]
        lines.append(f"{source}: {json_path(item['loc'], data)}: {message}")
    return "\n".join(lines)


def parse_model(model: type[ModelT], data: Any, source: str) -> ModelT:
    """Validate `data` as `model`; any error becomes a FormatError naming `source` and the path."""
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise FormatError(format_validation_error(error, data, source)) from None


def read_json(path: Path) -> Any:
    return _decode(_read_text(path), str(path))


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FormatError(f"{path}: file not found") from None
    except UnicodeDecodeError as error:
        raise FormatError(f"{path}: not UTF-8 text (byte {error.start})") from None


def _decode(text: str, source: str, position: bool = True) -> Any:
    """json.loads, every refusal a FormatError: bad syntax (at `source:line:column` when
    `position`), an integer of more digits than Python converts (ValueError) and nesting deeper
    than the decoder recurses (RecursionError)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        where = f"{source}:{error.lineno}:{error.colno}" if position else source
        raise FormatError(f"{where}: invalid JSON: {error.msg}") from None
    except ValueError as error:
        raise FormatError(f"{source}: invalid JSON: {error}") from None
    except RecursionError:
        raise FormatError(f"{source}: invalid JSON: nested too deeply") from None
    path = _lone_surrogate(data)
    if path is not None:
        raise FormatError(f"{source}: {path}: a string holds a lone surrogate (an unpaired \\ud800-\\udfff escape)")
    return data


def _lone_surrogate(data: Any) -> str | None:
    """The path of the first string or key that is not Unicode text (it could not be written
    back as UTF-8 JSON), found without recursion."""
    stack = [("$", data)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, str) and not _encodes(node):
            return path
        if isinstance(node, dict):
            for key, value in node.items():
                key_path = child_path(path, key)
                if not _encodes(key):
                    return key_path
                stack.append((key_path, value))
        elif isinstance(node, list):
            stack.extend((child_path(path, i), value) for i, value in enumerate(node))
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def read_jsonl(path: Path) -> list[tuple[int, Any]]:
    """(line number, decoded object) for every non-blank line (lines end at `\\n` only)."""
    rows = []
    for number, line in enumerate(_read_text(path).split("\n"), start=1):  # not splitlines(): U+2028 is JSON text
        if not line.strip():
            continue
        rows.append((number, _decode(line, f"{path}:{number}", position=False)))
    return rows
