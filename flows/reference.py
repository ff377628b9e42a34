"""The configuration reference (``docs/configuration.md``), generated from the config models themselves.

    python -m flows.reference > docs/configuration.md

Every section of an experiment TOML is a pydantic model; the page lists each with its docstring and a table of
its fields (TOML path, type, default). A unit test regenerates the page and compares it with the committed file,
so the reference cannot drift from what ``load_config`` accepts.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from flows.config import ExperimentConfig

HEADER = """# Configuration reference

An experiment is one TOML file (`configs/smoke.toml` and `configs/demo.toml` are complete examples). Each table
below is a section; nested sections are dotted (`[main.distributed]`). Unknown keys, wrong types and
out-of-range values are refused at load time, naming the field. `pretrain run CONFIG --dry-run` prints the
resolved config with every default filled in.

Generated from the config models by `python -m flows.reference`; do not edit by hand.
"""


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type_name(a) for a in args)}]"
    if annotation is type(None):
        return "none"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"section `{annotation.__name__}`"
    return getattr(annotation, "__name__", str(annotation))


def _default(field) -> str:
    if field.is_required():
        return "**required**"
    value = field.default_factory() if field.default is PydanticUndefined else field.default
    if isinstance(value, BaseModel):
        return "(section defaults)"
    text = json.dumps(value, default=str, ensure_ascii=False) if not isinstance(value, str) else json.dumps(value)
    return f"`{text}`" if len(text) <= 60 else f"`{text[:57]}...`"


def _models(model: type[BaseModel], path: str, array: bool = False) -> list[tuple[str, type[BaseModel], bool]]:
    """(dotted TOML path, model, whether it is an array of tables) for ``model`` and every nested section."""
    found = [(path, model, array)]
    for name, field in model.model_fields.items():
        for candidate in _nested(field.annotation):
            child = f"{path}.{name}" if path else name
            if typing.get_origin(field.annotation) is dict:
                child += ".<name>"
            found.extend(_models(candidate, child, typing.get_origin(field.annotation) is list))
    return found


def _nested(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        out.extend(_nested(arg))
    return out


def reference() -> str:
    """The Markdown reference of every config section."""
    parts = [HEADER]
    seen: set[tuple[str, type]] = set()
    for path, model, array in _models(ExperimentConfig, ""):
        if (path, model) in seen:
            continue
        seen.add((path, model))
        parts.append(f"## `[[{path}]]` (an array of tables)" if array else f"## `[{path}]`" if path else "## top level")
        doc = inspect.cleandoc(model.__doc__ or "")
        if doc:
            parts.append(re.sub(r"\n{3,}", "\n\n", doc))
        rows = ["| key | type | default |", "|---|---|---|"]
        for name, field in model.model_fields.items():
            if name == "name" and path.endswith("<name>"):
                continue  # a source's name is its table key
            note = f" — {field.description}" if field.description else ""
            rows.append(f"| `{name}` | {_type_name(field.annotation)} | {_default(field)}{note} |")
        parts.append("\n".join(rows))
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    print(reference(), end="")
