"""Hydra's override grammar, both ways: spell our values for verl, and read the user's overrides.

The command that the run composes is parsed again by verl's Hydra, so a value must spell in a
way Hydra reads back as the same value (a path or a number-like string must stay a string), and
a user's override must be read with the very parser verl uses, or a refusal could miss what
verl then applies. Nothing here knows the table.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

_UNQUOTED = re.compile(r"^[A-Za-z0-9_./-]+$")
_HYDRA_WORDS = {"true", "false", "null", "nan", "inf", "-inf", "+inf"}


def hydra_value(value: Any) -> str:
    """Spell a Python value as a Hydra override value that parses back to the same value.

    Strings are single-quoted unless they are plain words that Hydra would read as strings
    anyway, so that a path or a number-like string never turns into another type.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        if _UNQUOTED.match(value) and value.lower() not in _HYDRA_WORDS and not _looks_numeric(value):
            return value
        # Hydra reads a backslash as an escape only before a quote or at the end of the string.
        escaped = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value).replace("'", "\\'")
        return f"'{escaped}'"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    raise TypeError(f"cannot spell {value!r} as a Hydra value")


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class UserOverride(BaseModel):
    """One user override, as Hydra's own parser reads it."""

    model_config = ConfigDict(frozen=True)
    text: str
    key: str
    value: Any = None
    delete: bool = False


def parse_user_overrides(texts: Iterable[str]) -> list[UserOverride]:
    """Parse with Hydra's override grammar (the one verl will use); bad syntax raises ValueError."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    out: list[UserOverride] = []
    for text in texts:
        try:
            (parsed,) = parser.parse_overrides([text])
        except HydraException as exc:
            raise ValueError(f"override {text!r} is not valid Hydra syntax: {exc}") from None
        try:
            value = parsed.value()
        except Exception:  # a sweep or another construct we do not interpret
            value = text.partition("=")[2]
        out.append(UserOverride(text=text, key=parsed.key_or_group, value=value, delete=parsed.is_delete()))
    return out
