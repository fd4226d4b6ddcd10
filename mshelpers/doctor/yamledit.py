"""A YAML file edited in place: only the keys that change, the rest of the text as the user wrote it.

`--out` writes the file a user launches. Parsed and dumped again, it would lose every comment, the key order of
flow sections, and the anchors (`data_parallel: &dp 8` ... `dataset_strategy: [[*dp, 1]]`): dumped, the alias
becomes a literal that no longer follows dp. So each changed key's value is replaced on its own line (its
anchor and trailing comment kept), a missing key is inserted under its section, and the result is parsed again
and compared with the intended mapping; `edit_yaml_text` raises `YamlEditError` when they differ (a flow-style
section, a multi-line scalar), and the caller falls back to a full dump and says so.
"""
from __future__ import annotations

import copy
import json
import re
from typing import Any

_KEY = re.compile(r"^(?P<indent>[ ]*)(?P<key>[A-Za-z_][\w.\-]*)[ ]*:(?P<rest>(?:[ ].*)?)$")
_ANCHOR = re.compile(r"^[ ]*(?P<anchor>&[\w\-]+[ ]+)?")


class YamlEditError(ValueError):
    """The text could not be edited in place to the intended mapping (the caller dumps the file whole).
    Taught in: no notebook; doctor/diagnosis.py calls it."""


def flow(v: Any) -> str:
    """A value as one line of YAML that mindformers' loader reads back as the same Python value.
    Taught with the rest of doctor/yamledit.py in notebooks/12_your_config.ipynb."""
    if isinstance(v, bool):
        return "True" if v else "False"
    if v is None:
        return "null"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return v if re.fullmatch(r"[A-Za-z_][\w.\-]*", v) and v.lower() not in (
            "true", "false", "null", "yes", "no", "on", "off", "none") else json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(flow(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {flow(x)}" for k, x in v.items()) + "}"
    raise YamlEditError(f"no one-line YAML for {type(v).__name__}")


def _split_comment(rest: str) -> tuple[str, str]:
    """(value, ' # comment') of a line's text after its colon; a '#' inside quotes is not a comment."""
    quote = None
    for i, ch in enumerate(rest):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or rest[i - 1] in " \t"):
            j = i
            while j > 0 and rest[j - 1] in " \t":
                j -= 1
            return rest[:j], rest[j:]
    return rest.rstrip(), ""


def _index(lines: list[str]) -> dict[str, tuple[int, int]]:
    """{dotted key: (line number, indent)} of every block-mapping key (flow sections and list items not walked)."""
    out: dict[str, tuple[int, int]] = {}
    stack: list[tuple[int, str]] = []           # (indent, key) of the open mappings
    for i, line in enumerate(lines):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _KEY.match(line)
        indent = len(line) - len(line.lstrip(" "))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if not m:
            continue
        path = ".".join([k for _, k in stack] + [m["key"]])
        out.setdefault(path, (i, indent))
        stack.append((indent, m["key"]))
    return out


def _block_end(lines: list[str], i: int, indent: int) -> int:
    """The line after the block that key line `i` (at `indent`) opens: its more-indented children and blanks."""
    j = i + 1
    while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip(" ")) > indent
                              or lines[j].lstrip().startswith("- ") and len(lines[j]) - len(lines[j].lstrip(" ")) == indent):
        j += 1
    while j > i + 1 and not lines[j - 1].strip():   # trailing blanks belong to what follows
        j -= 1
    return j


def _set(d: dict, dotted: str, v: Any) -> None:
    node = d
    *parents, last = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = v


def _safe_loader(yaml: Any) -> Any:
    # libyaml's parser where PyYAML was built with it (its wheels are): the same mapping as SafeLoader's, about 9x as
    # fast over tests/data's 152 files; mindformers itself loads with SafeLoader
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_text(text: str) -> Any:
    """YAML text parsed as yaml.safe_load parses it, on libyaml's parser where PyYAML has it: the doctor's one parse
    (the edit loop below parses a whole file once per changed key). Raises yaml.YAMLError as safe_load does.
    Taught in: no notebook; doctor/readers.py, doctor/diagnosis.py call it."""
    import yaml
    return yaml.load(text, Loader=_safe_loader(yaml))


def edit_yaml_text(text: str, changes: dict[str, Any]) -> str:
    """`text` with each dotted key of `changes` set to its value, in place; every other line kept. Raises
    YamlEditError when the edited text does not parse to the original mapping with those keys set.
    Taught in: no notebook; doctor/diagnosis.py calls it."""
    import yaml
    lines = text.split("\n")
    for dotted, v in changes.items():
        if _get(load_text("\n".join(lines)), dotted) == v:
            continue                # already so: a derived key written with an alias of the changed one
        idx = _index(lines)
        if dotted in idx:
            i, indent = idx[dotted]
            m = _KEY.match(lines[i])
            value, comment = _split_comment(m["rest"])
            anchor = _ANCHOR.match(value)["anchor"] or ""
            end = _block_end(lines, i, indent) if not value.strip() or value.strip() == anchor.strip() else i + 1
            lines[i:end] = [f"{m['indent']}{m['key']}: {anchor}{flow(v)}{comment}"]
            continue
        *parents, last = dotted.split(".")
        parent = ".".join(parents)
        if parent and parent not in idx:
            raise YamlEditError(f"no block section {parent} to put {last} in")
        if not parent:
            lines.append(f"{last}: {flow(v)}")
            continue
        i, indent = idx[parent]
        children = [idx[k] for k in idx if k.startswith(parent + ".") and k.count(".") == dotted.count(".")]
        child_indent = min((c[1] for c in children), default=indent + 2)
        lines.insert(_block_end(lines, i, indent), f"{' ' * child_indent}{last}: {flow(v)}")
    new = "\n".join(lines)
    want = copy.deepcopy(load_text(text))
    shared = alias_paths(text)
    for dotted, v in changes.items():
        for path in [dotted, *shared.get(dotted, ())]:     # an anchored value: its aliases follow it
            _set(want, path, v)
    try:
        got = load_text(new)
    except yaml.YAMLError as e:
        raise YamlEditError(f"the edited text is not YAML ({str(e).splitlines()[0]})") from None
    if got != want:
        raise YamlEditError("the edited text does not read back as the intended mapping")
    return new


def alias_paths(text: str) -> dict[str, list[str]]:
    """{dotted key: the other dotted keys that hold the same node}: an anchored value (`batch_size: &bs 1`) and
    its aliases (`batch_size: *bs`), which change together when the anchored line does.
    Taught with the rest of doctor/yamledit.py in notebooks/12_your_config.ipynb."""
    import yaml
    try:
        root = yaml.compose(text, Loader=_safe_loader(yaml))
    except yaml.YAMLError:
        return {}
    seen: dict[int, list[str]] = {}

    def walk(node: Any, path: str, depth: int = 0) -> None:
        if depth > 50:
            return
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                key = f"{path}.{k.value}" if path else str(k.value)
                seen.setdefault(id(v), []).append(key)
                walk(v, key, depth + 1)
    walk(root, "")
    out: dict[str, list[str]] = {}
    for paths in seen.values():
        if len(paths) > 1:
            for p in paths:
                out[p] = [q for q in paths if q != p]
    return out


_MISSING = object()


def _get(d: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return _MISSING
        d = d[part]
    return d


def follow_derived(raw: dict, changes: dict[str, Any]) -> dict[str, Any]:
    """`changes` with the keys mindformers derives from a changed one: `parallel.dataset_strategy`'s first entry of
    each input is the data-parallel degree (mindformers checks it against data_parallel when full_batch is False),
    so a literal one follows data_parallel; one written with an alias of dp follows it by itself.
    Taught in: no notebook; doctor/diagnosis.py calls it."""
    out = dict(changes)
    dp = changes.get("parallel_config.data_parallel")
    ds = (raw.get("parallel") or {}).get("dataset_strategy") if isinstance(raw.get("parallel"), dict) else None
    old = (raw.get("parallel_config") or {}).get("data_parallel") if isinstance(raw.get("parallel_config"), dict) else None
    if dp is not None and isinstance(ds, list) and ds and all(isinstance(x, list) and x for x in ds) \
            and all(x[0] == old for x in ds) and "parallel.dataset_strategy" not in out:
        out["parallel.dataset_strategy"] = [[dp, *x[1:]] for x in ds]
    return out
