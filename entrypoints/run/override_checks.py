"""Checks on the user's overrides themselves, which no row of the table can say.

The table (:mod:`.overrides`) refuses a key by its value against what the run needs. Two
mistakes are about how the overrides are written, and verl would take both without a word:

* **A key given twice.** Hydra applies overrides in order and the last one wins silently. On
  Kubernetes the RayJob's entrypoint already sets the model path and the pool sizes from the run
  ConfigMap, and ``VERL_OVERRIDES`` comes after them: a second ``trainer.n_gpus_per_node``
  there would run verl on other sizes than the pods were given.
* **A Ray environment variable that is not a string.** ``+ray_kwargs.ray_init.runtime_env.
  env_vars.X=1`` reaches ``ray.init`` as an int, and Ray raises ``TypeError: runtime_env
  ['env_vars'] must be of type Dict[str, str]`` only after its start-up, some 24 s in
  (``ray/_private/runtime_env/validation.py``). Refused at once, naming the quoting that works.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from verl_consistency.entrypoints.run.hydra_syntax import UserOverride, hydra_value
from verl_consistency.entrypoints.run.override_schema import RUNTIME_ENV_PREFIX

QUOTE, ESCAPED = "'", "\\'"

K8S_SET_KEYS = ("actor_rollout_ref.model.path", "trainer.nnodes", "trainer.n_gpus_per_node")
"""Keys the shipped RayJob entrypoints set from the run ConfigMap (pool keys ending in these too)."""


def given_twice(parsed: Iterable[UserOverride]) -> list[str]:
    """One problem per key that two of the user's overrides set (``model=`` counted as its key)."""
    seen: dict[str, UserOverride] = {}
    problems = []
    for ov in parsed:
        first = seen.setdefault(ov.key, ov)
        if first is ov:
            continue
        hint = ""
        if ov.key in K8S_SET_KEYS or ov.key.endswith((".nnodes", ".n_gpus_per_node")):
            hint = (
                " On Kubernetes the RayJob's entrypoint sets it from the run ConfigMap: change "
                "MODEL_PATH, TRAINER_NODES, ROLLOUT_NODES or NPUS_PER_NODE there (with kustomize "
                "for the sizes), not VERL_OVERRIDES."
            )
        problems.append(
            f"refused `{ov.text}`: {ov.key} is given twice (first as `{first.text}`); verl would "
            f"silently take the last one. Keep one.{hint}"
        )
    return problems


def _kind(value: Any) -> str:
    kinds = (
        (bool, "a boolean"),
        (int, "an integer"),
        (float, "a number"),
        (list, "a list"),
        (dict, "a mapping"),
    )
    return next((name for cls, name in kinds if isinstance(value, cls)), "null")


def _not_strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [name for name, v in value.items() if not isinstance(v, str)]
    return [] if isinstance(value, str) else [""]


def ray_env_not_strings(parsed: Iterable[UserOverride]) -> list[str]:
    """One problem per Ray runtime-env variable whose value Hydra reads as anything but a string."""
    problems = []
    for ov in parsed:
        if ov.delete or not (ov.key == RUNTIME_ENV_PREFIX or ov.key.startswith(RUNTIME_ENV_PREFIX + ".")):
            continue
        for name in _not_strings(ov.value):
            value = ov.value[name] if name else ov.value
            full = f"{ov.key}.{name}" if name else ov.key
            quoted = f"+{full}='{hydra_value(value)}'"
            problems.append(
                f"refused `{ov.text}`: Hydra reads {full}={hydra_value(value)} as "
                f"{_kind(value)}, and Ray takes only strings as environment variables (it "
                f"raises TypeError at ray.init, after its start-up). Quote the value for Hydra: "
                f'{quoted} (in a shell: "{quoted}"; in the RayJob ConfigMap\'s VERL_OVERRIDES, '
                f"with the quotes escaped: {quoted.replace(QUOTE, ESCAPED)})"
            )
    return problems
