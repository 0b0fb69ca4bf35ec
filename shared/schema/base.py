"""Base model and the loader that turns validation errors into JSON-path messages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError

from shared.errors import FormatError

NonEmptyStr = Annotated[str, StringConstraints(min_length=1)]

ModelT = TypeVar("ModelT", bound=BaseModel)


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
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            node = None
    return path


def format_validation_error(error: ValidationError, data: Any, source: str) -> str:
    lines = []
    for item in error.errors():
        lines.append(f"{source}: {json_path(item['loc'], data)}: {item['msg']}")
    return "\n".join(lines)


def parse_model(model: type[ModelT], data: Any, source: str) -> ModelT:
    """Validate `data` as `model`; any error becomes a FormatError naming `source` and the path."""
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise FormatError(format_validation_error(error, data, source)) from None


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FormatError(f"{path}: file not found") from None
    except json.JSONDecodeError as error:
        raise FormatError(f"{path}:{error.lineno}:{error.colno}: invalid JSON: {error.msg}") from None


def read_jsonl(path: Path) -> list[tuple[int, Any]]:
    """(line number, decoded object) for every non-blank line."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FormatError(f"{path}: file not found") from None
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append((number, json.loads(line)))
        except json.JSONDecodeError as error:
            raise FormatError(f"{path}:{number}: invalid JSON: {error.msg}") from None
    return rows
