"""Loading frozen config dataclasses from keyword arguments, a YAML/TOML file and KVPOOL_* environment variables.

Precedence (later wins): dataclass defaults < file < environment < keyword arguments. Every config class
validates itself in `__post_init__` and raises ValueError naming the field; this module only parses and converts.
Environment variables are `<prefix><FIELD>` upper-case, e.g. KVPOOL_DRAM_BYTES=256MiB.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Mapping, TypeVar

T = TypeVar("T")

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_SIZE_MULT = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12,
              "tb": 10**12, "ki": 1 << 10, "kib": 1 << 10, "mi": 1 << 20, "mib": 1 << 20, "gi": 1 << 30,
              "gib": 1 << 30, "ti": 1 << 40, "tib": 1 << 40}


def parse_size(value: Any, field: str) -> int:
    """'256MiB', '4G', '1024', 1024 -> bytes. Raises ValueError naming `field`."""
    if isinstance(value, bool):
        raise ValueError(f"{field}: expected a size like 256MiB, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            return int(float(m.group(1)) * _SIZE_MULT[(m.group(2) or "").lower()])
    raise ValueError(f"{field}: expected a size like 256MiB or an integer byte count, got {value!r}")


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
