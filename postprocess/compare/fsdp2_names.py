"""Give an FSDP2 training dump the module names msprobe's consistency check understands.

msprobe 26.2.0's ``compare --consistent_check --backend fsdp`` finds a training module's vLLM
counterpart by cutting its dump name after the last FSDP1 wrapper, ``_fsdp_wrapped_module.``
(``ProcessDf.get_op_module_and_class``), and has no FSDP2 option. verl's ``strategy=fsdp2``
(``apply_fsdp2`` → ``fully_shard``) adds no wrapper module; it swaps each sharded module's class
for a generated subclass named ``FSDP<class>``. So the same layer is dumped as

    FSDP1  Module._fsdp_wrapped_module.model.layers.0._fsdp_wrapped_module.mlp.down_proj.Linear.forward.0
    FSDP2  Module.model.layers.0.mlp.down_proj.Linear.forward.0
    FSDP1  Module._fsdp_wrapped_module.model.layers.0._fsdp_wrapped_module.Qwen2DecoderLayer.forward.0
    FSDP2  Module.model.layers.0.FSDPQwen2DecoderLayer.forward.0
    FSDP1  Module._fsdp_wrapped_module.model.embed_tokens.Embedding.forward.0
    FSDP2  Module.model.embed_tokens.FSDPEmbedding.forward.0

and none of the FSDP2 names maps. :func:`fsdp1_names` rewrites every module name of an FSDP2
dump into the name verl's ``strategy=fsdp`` (FSDP1, one unit per decoder layer plus the root)
gives the same module, and :func:`write_fsdp1_view` writes a renamed *copy* of the dump folder's
JSON files for msprobe to read. In tensor mode msprobe names rows after the tensor files
(``data_name``), so those are renamed too and the copy's ``dump_tensor_data/`` holds one link per
tensor, under its FSDP1 name, to the original file. The input dump is never touched.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

WRAPPER = "_fsdp_wrapped_module."
"""FSDP1's wrapper attribute, as it appears in module paths."""
FSDP2_CLASS_PREFIX = "FSDP"
"""``fully_shard`` renames a module's class to ``FSDP<class>`` (torch ``_fully_shard``)."""

_MODULE_KEY = re.compile(
    r"^Module\.(?P<path>.+)\.(?P<cls>[A-Za-z_][A-Za-z0-9_]*)\.(?P<dir>forward|backward)\.(?P<call>\d+)$"
)
_DECODER_LAYER = re.compile(r"(^|\.)layers\.\d+$")
_CALL = re.compile(r"^(?P<key>.*?\.(?:forward|backward)\.\d+)(?P<rest>(?:\..*)?)$")

DUMP_FILES = ("dump.json", "construct.json", "stack.json")
TENSOR_DIR = "dump_tensor_data"


def _sharded_class(cls: str) -> bool:
    return cls.startswith(FSDP2_CLASS_PREFIX) and len(cls) > len(FSDP2_CLASS_PREFIX)


def is_fsdp2(keys: Iterable[str]) -> bool:
    """True for a module-level dump of a ``fully_shard`` model: an ``FSDP<class>``, no FSDP1 wrapper."""
    found = False
    for key in keys:
        if WRAPPER in key:
            return False
        m = _MODULE_KEY.match(key)
        if m and _sharded_class(m.group("cls")):
            found = True
    return found


def fsdp1_names(keys: Iterable[str]) -> dict[str, str]:
    """FSDP2 module key → the key an FSDP1-wrapped (verl ``strategy=fsdp``) model dumps.

    The root gets a wrapper; so does every sharded module that holds other modules (a decoder
    layer: its path ends in ``layers.<n>``, or other dumped modules sit under it). Leaf units that
    verl's FSDP2 shards and its FSDP1 does not (``embed_tokens``, ``lm_head``) only lose the
    ``FSDP`` class prefix. Keys that are not module keys (API-level rows) are left out.
    """
    parsed = [(k, m) for k in keys if (m := _MODULE_KEY.match(k))]
    paths = {m.group("path") for _, m in parsed}
    units = {
        m.group("path")
        for _, m in parsed
        if _sharded_class(m.group("cls"))
        and (
            _DECODER_LAYER.search(m.group("path")) or any(p.startswith(m.group("path") + ".") for p in paths)
        )
    }
    out: dict[str, str] = {}
    for key, m in parsed:
        parts = m.group("path").split(".")
        path = WRAPPER
        for i, part in enumerate(parts):
            path += part + "."
            if ".".join(parts[: i + 1]) in units:
                path += WRAPPER
        cls = m.group("cls")
        if _sharded_class(cls):
            cls = cls[len(FSDP2_CLASS_PREFIX) :]
        out[key] = f"Module.{path}{cls}.{m.group('dir')}.{m.group('call')}"
    return out


def _rename_data_names(value: Any, key: str, new: str, links: dict[str, str]) -> Any:
    """Rename every ``data_name`` (``<key>.<rest>.pt``) under one dump entry; note old → new file."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k == "data_name" and isinstance(v, str) and v.startswith(key + "."):
                out[k] = new + v[len(key) :]
                links[out[k]] = v
            else:
                out[k] = _rename_data_names(v, key, new, links)
        return out
    if isinstance(value, list):
        return [_rename_data_names(v, key, new, links) for v in value]
    return value


def _rename(value: Any, names: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return names.get(value, value)
    if isinstance(value, list):
        return [_rename(v, names) for v in value]
    return value


def write_fsdp1_view(src: Path, dst: Path) -> dict[str, str] | None:
    """Write ``src``'s dump with FSDP1 names into ``dst``; ``None`` (nothing written) unless FSDP2.

    ``dump.json``'s ``data`` keys and ``data_name`` fields, ``construct.json``'s keys and parents
    and ``stack.json``'s name lists are renamed; everything else is copied as is (stdlib ``json``:
    msprobe writes bare ``NaN``). Tensor files are linked, never copied. Returns the rename map.
    """
    dump = json.loads((src / "dump.json").read_text())
    data = dump.get("data")
    if not isinstance(data, dict) or not is_fsdp2(data):
        return None
    names = fsdp1_names(data)
    dst.mkdir(parents=True, exist_ok=True)
    links: dict[str, str] = {}
    dump["data"] = {
        names.get(k, k): _rename_data_names(v, k, names[k], links) if k in names else v
        for k, v in data.items()
    }
    (dst / "dump.json").write_text(json.dumps(dump))
    construct = src / "construct.json"
    if construct.is_file():
        tree = json.loads(construct.read_text())
        renamed = {names.get(k, k): _rename(v, names) for k, v in tree.items()}
        (dst / "construct.json").write_text(json.dumps(renamed))
    stack = src / "stack.json"
    if stack.is_file():
        stacks = json.loads(stack.read_text())
        if isinstance(stacks, dict):
            stacks = {
                k: [_rename(v[0], names), *v[1:]] if isinstance(v, list) and v else v
                for k, v in stacks.items()
            }
        (dst / "stack.json").write_text(json.dumps(stacks))
    tensors = (src / TENSOR_DIR).resolve()
    if tensors.is_dir():
        (dst / TENSOR_DIR).mkdir()
        for new, old in links.items():
            if (tensors / old).is_file():
                (dst / TENSOR_DIR / new).symlink_to(tensors / old)
        renamed_files = set(links.values())
        for f in tensors.iterdir():  # API-level tensors (level mix) keep their names
            if f.name not in renamed_files and not (dst / TENSOR_DIR / f.name).exists():
                (dst / TENSOR_DIR / f.name).symlink_to(f)
    return names


def restore(name: str, back: Mapping[str, str]) -> str:
    """An msprobe row name (``;``-joined for fused rows) in FSDP1 form → the dump's own FSDP2 name."""

    def one(part: str) -> str:
        m = _CALL.match(part.strip())
        if not m or m.group("key") not in back:
            return part
        lead = part[: len(part) - len(part.lstrip())]
        return lead + back[m.group("key")] + m.group("rest")

    return ";".join(one(p) for p in name.split(";"))
