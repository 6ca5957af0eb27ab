"""From a command's options to the options object its work takes, without naming each one twice.

A typer command receives its options as parameters (typer reads them from the signature), and
the work behind it takes one frozen options object (``CheckOptions``, ``DemoOptions``,
``PlanOptions``): a function of seventeen parameters cannot be read, called or tested well.
Writing ``CheckOptions(model=model, device=device, ...)`` by hand repeats every name and lets a
new option be forgotten on one side; :func:`options_from` copies the values whose names are the
object's fields, so a new option is a parameter and a field, nothing more.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def options_from(cls: type[T], values: Mapping[str, Any], **renamed: Any) -> T:
    """``cls`` (a dataclass) built from the entries of ``values`` named like its fields.

    ``values`` is typically the command's ``locals()`` at its first line, i.e. exactly its
    parameters; entries that are not fields (``ctx``, ``dry_run``, ...) are left out. ``renamed``
    gives the fields whose value has another name, or is computed (``prompts_file=prompts``), and
    wins over ``values``. A field in neither keeps its default; one without a default is the
    dataclass's own ``TypeError``, as is a ``renamed`` name that is no field.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"options_from builds dataclasses; {cls!r} is not one")
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    picked = {k: v for k, v in values.items() if k in names}
    return cls(**{**picked, **renamed})
