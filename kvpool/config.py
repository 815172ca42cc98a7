"""Loading frozen config dataclasses from keyword arguments, a YAML/TOML file and KVPOOL_* environment variables.

Precedence (later wins): dataclass defaults < file < environment < keyword arguments. Every config class
validates itself in `__post_init__` and raises ValueError naming the field; this module only parses and converts.
Environment variables are `<prefix><FIELD>` upper-case, e.g. KVPOOL_DRAM_BYTES=256MiB.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from pathlib import Path
from typing import Any, Mapping, TypeVar

from kvpool.store.config import parse_size  # noqa: F401 - re-exported: sizes are parsed where fields are defined

T = TypeVar("T")

def read_config_file(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"config file {str(p)!r} does not exist")
    text = p.read_text()
    if p.suffix == ".toml":
        import tomllib

        data = tomllib.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {str(p)!r}: top level must be a mapping of field: value")
    return data


def _convert(field: dataclasses.Field, value: Any) -> Any:
    hint = field.type if not isinstance(field.type, str) else None
    name = field.name
    target = hint
    if hint is not None and typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            return None
        target = args[0] if len(args) == 1 else None
    if name.endswith("_bytes"):
        return parse_size(value, name)
    if isinstance(value, str):
        try:
            if target is bool:
                low = value.lower()
                if low in ("1", "true", "yes", "on"):
                    return True
                if low in ("0", "false", "no", "off"):
                    return False
                raise ValueError
            if target is int:
                return int(value)
            if target is float:
                return float(value)
        except ValueError:
            raise ValueError(f"{name}: cannot parse {value!r} as {target.__name__}") from None
    return value


def load_config(cls: type[T], path: str | os.PathLike | None = None, *, env: Mapping[str, str] | None = None,
                env_prefix: str = "KVPOOL_", **overrides: Any) -> T:
    """Build `cls` from defaults < file < env < overrides. Unknown keys raise ValueError naming them."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    for f in fields.values():
        f.type = hints.get(f.name, f.type)
    values: dict[str, Any] = {}
    if path is not None:
        for key, value in read_config_file(path).items():
            norm = str(key).replace("-", "_")
            if norm not in fields:
                raise ValueError(f"{path}: unknown field {key!r}; valid fields: {', '.join(sorted(fields))}")
            values[norm] = _convert(fields[norm], value)
    env = os.environ if env is None else env
    for name, f in fields.items():
        var = env_prefix + name.upper()
        if var in env:
            values[name] = _convert(f, env[var])
    for key, value in overrides.items():
        if key not in fields:
            raise ValueError(f"unknown field {key!r}; valid fields: {', '.join(sorted(fields))}")
        values[key] = _convert(fields[key], value) if isinstance(value, str) else value
    return cls(**values)
