"""Base class of every config section: strict (unknown keys rejected) and frozen once built.

Config files are validated with ``validate_strict``: numbers and booleans must be TOML numbers and booleans, never
strings (``vocab_size = "1024"`` is refused, ``peak_lr = 1`` is read as 1.0), and every problem is reported on one
line with its dotted field path, the bad value and the fix.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from infra.errors import ConfigError

S = TypeVar("S", bound="Section")

_KINDS = {"int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
          "float_type": "a number", "float_parsing": "a number", "bool_type": "true or false",
          "bool_parsing": "true or false", "string_type": "a string", "list_type": "a list",
          "dict_type": "a table", "model_type": "a table", "model_attributes_type": "a table"}


class Section(BaseModel):
    """A validated, immutable config section.

    Unknown keys raise at load time (``extra="forbid"``), so a typo never silently falls back to a default;
    ``inf`` and ``nan`` are refused in every float field. A ``ConfigError`` raised by one validator while the
    section is built directly (``MinHashConfig(bands=20)``) is raised as itself rather than wrapped.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as err:
            errors = err.errors()
            cause = errors[0].get("ctx", {}).get("error") if len(errors) == 1 else None
            if isinstance(cause, ConfigError):
                raise cause from None
            raise

    # Marks this __init__ as pydantic's own (as RootModel does): nested sections are then validated by pydantic
    # directly, so a strict validation reaches them and their errors keep their field paths.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def validate_strict(cls: type[S], raw: Any, origin: str) -> S:
        """Build the section from config-file data, with numbers and booleans taken only as TOML types.

        Raises:
            ConfigError: one line, ``origin: invalid config: path: problem (got value); ...`` for every problem.
        """
        try:
            return cls.model_validate(raw, strict=True)
        except ValidationError as err:
            problems = "; ".join(describe_error(cls, e) for e in err.errors())
            raise ConfigError(f"{origin}: invalid config: {problems}") from None


def describe_error(root: type[BaseModel], error: Any) -> str:
    """``path: problem (got value)`` with the fix, for one pydantic error dict of a validation of ``root``."""
    loc = [str(p) for p in error["loc"] if p != "[key]"]
    path = ".".join(loc)
    kind, value = error["type"], error.get("input")
    cause = error.get("ctx", {}).get("error")
    if kind == "extra_forbidden":
        return f"{path}: unknown key; {_key_hint(root, error['loc'])}"
    if kind == "missing":
        field = _field_at(root, error["loc"])
        if field is not None and _as_model(field.annotation) is not None:
            return f"{path}: required section missing; add a [{path}] table"
        return f"{path}: required but missing; add it (e.g. {loc[-1]} = ...)"
    if kind in _KINDS and isinstance(value, str) and kind not in ("string_type",):
        return f"{path}: expected {_KINDS[kind]}, got the string {value!r}; {_unquote_hint(kind, value, loc[-1])}"
    if kind in _KINDS:
        return f"{path}: expected {_KINDS[kind]}, got {type(value).__name__} {_short(value)}"
    message = str(cause) if cause is not None else error["msg"]
    got = _short(value)
    if isinstance(value, (int, float, str)) and (cause is None or got not in message):
        message += f" (got {got})"
    if not path or _names(message, path):  # a section's own check names its field (``mixture.seeds = 0: ...``)
        return message
    return f"{path}: {message}"


def _names(message: str, path: str) -> bool:
    """``message`` starts with the field path ``path`` or one of its fields (``path.key``)."""
    return message.startswith(path) and message[len(path):len(path) + 1] in ("", ".", ":", " ", "[")


def _unquote_hint(kind: str, value: str, key: str) -> str:
    """Suggest the unquoted literal only when the string is one (``"3e-4"`` → ``3e-4``; ``"yes"`` is not)."""
    if kind == "list_type":
        return f"write it as a list: {key} = [{value!r}]".replace("'", '"')
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"write {key} as a table ({key} = {{ ... }} or a [{key}] section)"
    if kind.startswith("bool"):
        literal = value.strip().lower() if value.strip().lower() in ("true", "false") else None
        return f"write {key} = {literal} without quotes" if literal else f"write {key} = true or {key} = false"
    try:
        float(value)
    except ValueError:
        return f"give {key} a number, without quotes"
    return f"write it without quotes (e.g. {key} = {value.strip()})"


def _field_at(root: type[BaseModel], loc: tuple) -> Any:
    model = _model_at(root, tuple(loc[:-1])) if len(loc) > 1 else root
    return None if model is None else model.model_fields.get(str(loc[-1]))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _key_hint(root: type[BaseModel], loc: tuple) -> str:
    model = _model_at(root, loc[:-1])
    if model is None:
        return "remove it"
    known = sorted(model.model_fields)
    return f"{did_you_mean(str(loc[-1]), known)}remove it or use one of {known}"


def did_you_mean(word: str, known: list[str]) -> str:
    """``did you mean 'tokenizer'? `` for the entry of ``known`` closest to a misspelt ``word`` (difflib's ratio
    >= 0.6), else ""."""
    close = difflib.get_close_matches(word, known, n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def _model_at(root: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The model class whose fields the table at ``loc`` holds, or None where that cannot be told."""
    annotation: Any = root
    for part in loc:
        model = _as_model(annotation)
        if model is not None and isinstance(part, str) and part in model.model_fields:
            annotation = model.model_fields[part].annotation
            continue
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        origin = typing.get_origin(annotation)
        if origin in (list, dict) and args:
            annotation = args[-1]  # a list index or a dict key: step into the element type
        else:
            return None
    return _as_model(annotation)


def _as_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        return models[0] if len(models) == 1 else None
    return None


# Field metadata of a setting that does not change a stage's result (log and checkpoint intervals, the launch
# layout, ...): ``Field(default=..., json_schema_extra=NOT_IN_KEY)``. ``key_dump`` leaves such fields out, so
# changing them reuses the cached artifact. The mark sits on the field it describes.
NOT_IN_KEY: dict[str, Any] = {"in_key": False}


def in_key(field: Any) -> bool:
    """False for a pydantic field marked ``NOT_IN_KEY``."""
    extra = getattr(field, "json_schema_extra", None)
    return not (isinstance(extra, dict) and extra.get("in_key") is False)


def key_dump(section: BaseModel) -> dict[str, Any]:
    """``section.model_dump()`` without the fields marked ``NOT_IN_KEY``, at any depth (nested sections, and
    sections inside dicts or lists): the part of a config that a stage's artifact key hashes."""
    return _prune(section, section.model_dump())


def _prune(value: Any, dumped: Any) -> Any:
    if isinstance(value, BaseModel):
        for name, field in type(value).model_fields.items():
            if not in_key(field):
                dumped.pop(name, None)
            elif name in dumped:
                dumped[name] = _prune(getattr(value, name), dumped[name])
    elif isinstance(value, dict) and isinstance(dumped, dict):
        for k, v in value.items():
            if k in dumped:
                dumped[k] = _prune(v, dumped[k])
    elif isinstance(value, (list, tuple)) and isinstance(dumped, (list, tuple)) and len(value) == len(dumped):
        dumped = type(dumped)(_prune(v, d) for v, d in zip(value, dumped))
    return dumped
