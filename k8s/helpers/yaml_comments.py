"""Carry the comments of kustomize sources into kustomize's output, by field path.

Why: ``kubectl kustomize`` drops every comment, and the rendered k8s/*-rayjob.yaml are what most
users open. The sources say, field by field, what each value is for (KubeRay samples style);
this puts those lines back above (or beside) the same fields of the output, and nothing else
of the output changes: the output's own text is kept line for line, comments are only inserted.

A field's *path* names mapping keys, and list items by their ``groupName``, ``name`` or ``key``
(the first present and unique in the list), else by position: ``spec / rayClusterSpec /
workerGroupSpecs / [groupName=trainer] / rayStartParams``. Identities rather than positions,
because kustomize reorders keys and patches add list items. In a source, the comment lines
right above a line (no blank line between) and a comment at its end belong to the shallowest
field that starts on that line; a file of one document also gives the comment block before its
``---`` to the document. In a JSON patch (kustomization ``patches``), the comments of an
operation belong to the field its ``path`` names in the output.

Standard library and PyYAML only (its node marks give every field's line): ``make manifests``
runs this in a small tool venv, not the project's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

Path = tuple[str, ...]
DocKey = tuple[str, str]
"""A document's (kind, metadata.name)."""

IDENTITY_KEYS = ("groupName", "name", "key")


@dataclass
class Note:
    """The comment lines of one field: ``above`` it (each ``# ...``) and at its line's ``eol``."""

    above: list[str] = field(default_factory=list)
    eol: list[str] = field(default_factory=list)

    def merge(self, other: Note) -> None:
        self.above += [line for line in other.above if line not in self.above]
        self.eol += [c for c in other.eol if c not in self.eol]


Notes = dict[Path, Note]


def _add(notes: Notes, path: Path, note: Note) -> None:
    if note.above or note.eol:
        notes.setdefault(path, Note()).merge(note)


def _scalar(node: yaml.Node | None) -> str | None:
    return node.value if isinstance(node, yaml.ScalarNode) else None


def _mapping_get(node: yaml.Node, key: str) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if _scalar(k) == key:
                return v
    return None


def item_ids(items: list[Any], get: Any) -> list[str]:
    """The path element of each list item: ``[key=value]`` by the first identity key that every
    mapping item holds with distinct values, else ``[index]``."""
    for key in IDENTITY_KEYS:
        values = [get(item, key) for item in items]
        if values and all(isinstance(v, str) for v in values) and len(set(values)) == len(values):
            return [f"[{key}={v}]" for v in values]
    return [f"[{i}]" for i in range(len(items))]


def _node_ids(items: list[yaml.Node]) -> list[str]:
    return item_ids(items, lambda n, k: _scalar(_mapping_get(n, k)))


def _obj_ids(items: list[Any]) -> list[str]:
    return item_ids(items, lambda o, k: o.get(k) if isinstance(o, dict) else None)


def walk(node: yaml.Node, path: Path = ()) -> Iterator[tuple[Path, yaml.Node, yaml.Node]]:
    """Every field in document order, parents first: (path, node that starts it, value node).

    A mapping key starts its field; a list item starts itself."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            here = (*path, str(key.value))
            yield here, key, value
            yield from walk(value, here)
    elif isinstance(node, yaml.SequenceNode):
        for ident, item in zip(_node_ids(node.value), node.value, strict=True):
            here = (*path, ident)
            yield here, item, item
            yield from walk(item, here)


def _content_lines(root: yaml.Node) -> set[int]:
    """Lines inside multi-line scalars (a ``#`` there is text, not a comment)."""
    lines: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.ScalarNode):
            # a block scalar ends at the start of the line after its last one
            end = node.end_mark.line - (node.end_mark.column == 0)
            lines.update(range(node.start_mark.line + 1, end + 1))
        elif isinstance(node, yaml.MappingNode):
            stack += [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            stack += node.value
    return lines


def eol_comment(line: str) -> str | None:
    """The ``# ...`` at the end of a YAML line, outside quotes; None if there is none."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[i:].rstrip() if line[:i].strip() else None
    return None


def _is_comment(line: str) -> bool:
    return line.lstrip().startswith("#")


def _above(lines: list[str], at: int, content: set[int]) -> list[str]:
    """The comment lines right above line ``at`` (stopping at a blank or content line)."""
    found: list[str] = []
    i = at - 1
    while i >= 0 and i not in content and _is_comment(lines[i]):
        found.append(lines[i].strip())
        i -= 1
    return found[::-1]


def notes_of_node(root: yaml.Node, lines: list[str], base: Path = ()) -> Notes:
    """The notes of every field under ``root`` (paths prefixed with ``base``)."""
    content = _content_lines(root)
    notes: Notes = {}
    seen_lines: set[int] = set()
    for path, start, _ in [((), root, root), *walk(root)]:
        line = start.start_mark.line
        if line in seen_lines or line in content:
            continue  # only the shallowest field of a line takes its comments
        seen_lines.add(line)
        eol = eol_comment(lines[line])
        _add(notes, (*base, *path), Note(_above(lines, line, content), [eol] if eol else []))
    return notes


def _header(lines: list[str]) -> list[str]:
    """The comment block at the top of a file, up to its first ``---``."""
    head: list[str] = []
    for line in lines:
        if line.strip() == "---":
            return head
        if line.strip() and not _is_comment(line):
            return []
        if _is_comment(line):
            head.append(line.strip())
    return []


def source_notes(text: str) -> dict[DocKey, Notes]:
    """The notes of each document of a source file, by (kind, name)."""
    lines = text.splitlines()
    roots = [r for r in yaml.compose_all(text, Loader=yaml.SafeLoader) if r is not None]
    found: dict[DocKey, Notes] = {}
    for root in roots:
        kind = _scalar(_mapping_get(root, "kind")) or ""
        name = _scalar(_mapping_get(_mapping_get(root, "metadata") or root, "name")) or ""
        notes = notes_of_node(root, lines)
        if len(roots) == 1 and (head := _header(lines)):
            notes.setdefault((), Note()).above[:0] = head
        found[(kind, name)] = notes
    return found


def pointer_path(obj: Any, pointer: str) -> Path | None:
    """A JSON pointer (RFC 6901) as a path of ``obj``; None where it does not resolve."""
    path: list[str] = []
    here = obj
    for raw in pointer.lstrip("/").split("/") if pointer.strip("/") else []:
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(here, dict) and token in here:
            path.append(token)
            here = here[token]
        elif isinstance(here, list) and (token == "-" or token.isdigit()):
            index = len(here) - 1 if token == "-" else int(token)
            if not 0 <= index < len(here):
                return None
            path.append(_obj_ids(here)[index])
            here = here[index]
        else:
            return None
    return tuple(path)


def patch_notes(patch: str, target: Any) -> tuple[Notes, list[str]]:
    """The notes of a JSON patch's operations, at the fields they write in ``target`` (the
    rendered document), and the operations whose comments found no field there."""
    lines = patch.splitlines()
    root = yaml.compose(patch, Loader=yaml.SafeLoader)
    notes: Notes = {}
    lost: list[str] = []
    if not isinstance(root, yaml.SequenceNode):
        return notes, lost
    content = _content_lines(root)
    for op in root.value:
        op_notes = notes_of_node(op, lines)
        if not op_notes:
            continue
        pointer = _scalar(_mapping_get(op, "path")) or ""
        path = pointer_path(target, pointer)
        if path is None or _scalar(_mapping_get(op, "op")) in ("test", "remove"):
            lost.append(f"{_scalar(_mapping_get(op, 'op'))} {pointer}")
            continue
        # Every comment of the operation (above it, and above its path or value) goes above
        # the field it writes; an end-of-line comment stays one.
        merged = Note(_above(lines, op.start_mark.line, content))
        for note in op_notes.values():
            merged.merge(note)
        _add(notes, path, merged)
    return notes, lost


def _fits_at_line_end(start: yaml.Node, value: yaml.Node) -> bool:
    """Whether a comment can follow the field's first line. A list item's (or a document's)
    first line holds its first key: that key's value decides. A comment fits after a block
    collection's key, a block scalar's indicator, or a scalar that ends on its first line."""
    if start is value and isinstance(value, yaml.MappingNode) and value.value:
        value = value.value[0][1]
    if isinstance(value, yaml.ScalarNode):
        return value.style in ("|", ">") or value.start_mark.line == value.end_mark.line
    return True


def insert(text: str, notes_of: Mapping[DocKey, Notes]) -> str:
    """``text`` (kustomize's output) with each document's notes inserted at their fields."""
    lines = text.splitlines()
    above: dict[int, list[str]] = {}
    eol: dict[int, list[str]] = {}
    for root in yaml.compose_all(text, Loader=yaml.SafeLoader):
        if root is None:
            continue
        obj = yaml.safe_load(yaml.serialize(root))
        key = (str(obj.get("kind", "")), str((obj.get("metadata") or {}).get("name", "")))
        notes = notes_of.get(key, {})
        for path, start, value in [((), root, root), *walk(root)]:
            note = notes.get(path)
            if note is None:
                continue
            line = start.start_mark.line
            here = above.setdefault(line, [])
            here += [c for c in note.above if c not in here]
            if _fits_at_line_end(start, value):
                eol.setdefault(line, []).extend(note.eol)
            else:  # a comment after a multi-line scalar's first line would end the scalar
                here += note.eol
    out: list[str] = []
    for i, line in enumerate(lines):
        indent = " " * (len(line) - len(line.lstrip()))
        out += [f"{indent}{c}" for c in above.get(i, [])]
        comments = eol.get(i)
        out.append(f"{line}  {'  '.join(comments)}" if comments else line)
    return "\n".join(out) + "\n"
