"""The Ascend code paths cannot run here, so check them against the installed MindSpore and mindformers.

Every MindSpore/mindformers call in (a) notebook cells gated on Ascend (`require("Ascend")` or another test of
"Ascend") and (b) `mshelpers/workers/*.py` is collected with `ast`: names are resolved through the file's imports
(`import mindspore as ms`, `from mindspore import nn`, `from mindformers.x import Y`) and through simple
assignments (`p = AutoParallel(...)` makes `p.hsdp(...)` a call of `AutoParallel.hsdp`). Each callable must exist
in the pinned versions and `inspect.signature(...).bind` must accept its positional count and keywords. Callables
that take **kwargs are checked against what they really accept: `set_context` and `set_auto_parallel_context`
against the keys MindSpore recognises, mindformers classes against the explicit parameters of every `__init__` in
their MRO. A keyword such as the seeds' `set_context(optimize_kernel_cfg_path=...)` fails here.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
WORKERS = sorted(p for p in (ROOT / "mshelpers" / "workers").glob("*.py") if p.name != "__init__.py")
ROOTS = ("mindspore", "mindformers")


# ---------------------------------------------------------------- collection
def import_aliases(tree: ast.AST) -> dict[str, str]:
    """{local name: qualified name} for every mindspore/mindformers import in `tree`."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in ROOTS:
                    out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ROOTS and not node.level:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _dotted(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id] + parts[::-1]
    return None


def resolve_name(node: ast.AST, aliases: dict[str, str]) -> str | None:
    parts = _dotted(node)
    if not parts or parts[0] not in aliases:
        return None
    return ".".join([aliases[parts[0]]] + parts[1:])


def collect_calls(tree: ast.AST, aliases: dict[str, str], where: str) -> list[dict]:
    """Calls whose callee resolves into mindspore/mindformers: name, positional count, keywords, line."""
    instances = {}
    for node in ast.walk(tree):        # `x = SomeMindSporeClass(...)`: x.method(...) resolves through the class
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            q = resolve_name(node.value.func, aliases)      # imports only: calling an instance builds no class
            if q and q.split(".")[-1][:1].isupper():
                instances[node.targets[0].id] = q
    import_only = set(aliases)
    aliases = {**instances, **aliases}
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        q = resolve_name(node.func, aliases)
        if not q or q.split(".")[0] not in ROOTS:
            continue
        parts = _dotted(node.func)
        bound = parts[0] in instances and parts[0] not in import_only
        if bound and len(parts) == 1:
            continue                     # calling an instance runs its construct(): not a signature to check
        calls.append({"name": q, "where": f"{where}:{node.lineno}", "bound": bound,
                      "n_pos": None if any(isinstance(a, ast.Starred) for a in node.args) else len(node.args),
                      "keywords": [k.arg for k in node.keywords if k.arg is not None],
                      "spread": any(k.arg is None for k in node.keywords)
                                or any(isinstance(a, ast.Starred) for a in node.args)})
    return calls


def ascend_gated(source: str) -> bool:
    return 'require("Ascend")' in source or "require('Ascend')" in source or (
        "Ascend" in source and any(s in source for s in ("device_target", "is_available", "DeviceUnavailable")))


def notebook_calls(path: Path) -> list[dict]:
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    sources = ["".join(c["source"]) for c in cells]
    trees = []
    for s in sources:
        try:
            trees.append(ast.parse("\n".join(l for l in s.splitlines() if not l.lstrip().startswith(("%", "!")))))
        except SyntaxError:
            trees.append(None)
    aliases = {}
    for t in trees:                      # imports from every cell: a gated cell uses names bound earlier
        if t is not None:
            aliases.update(import_aliases(t))
    out = []
    for i, (s, t) in enumerate(zip(sources, trees)):
        if t is not None and ascend_gated(s):
            out += collect_calls(t, aliases, f"{path.name} code cell {i}")
    return out


def source_calls(source: str, where: str) -> list[dict]:
    tree = ast.parse(source)
    return collect_calls(tree, import_aliases(tree), where)


# ---------------------------------------------------------------- checking
def resolve_object(qualname: str):
    parts = qualname.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)      # AttributeError: the callable does not exist in this version
        return obj
    raise ImportError(qualname)


def _set_context_keys() -> set[str]:
    import mindspore.context as c
    tree = ast.parse(inspect.getsource(c))
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "set_context")
    keys = {k.arg for d in fn.decorator_list if isinstance(d, ast.Call) for k in d.keywords}
    ctx = c._context()
    keys |= set(ctx.setters) | {k for k in c.ms_ctx_param.__members__ if not k.startswith("_")}
    return keys


def _auto_parallel_keys() -> set[str]:
    from mindspore.parallel import _auto_parallel_context as a
    return set(a._set_auto_parallel_context_func_map)


def _kwargs_literals(fn) -> set[str] | None:
    """The keys a function reads from its **kwargs by literal (`kw.get("k")`, `kw["k"]`, `"k" in kw`), or None
    when it hands **kwargs on or iterates it (then nothing can be said)."""
    if inspect.isclass(fn):
        return None
    try:
        tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(fn)) if False else
                         __import__("textwrap").dedent(inspect.getsource(fn)))
        kw = next(p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.VAR_KEYWORD)
    except (OSError, TypeError, ValueError, StopIteration, SyntaxError):
        return None
    keys, handled = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == kw \
                and isinstance(node.slice, ast.Constant):
            keys.add(node.slice.value); handled.add(id(node.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                and node.func.value.id == kw and node.func.attr in ("get", "pop", "setdefault") and node.args \
                and isinstance(node.args[0], ast.Constant):
            keys.add(node.args[0].value); handled.add(id(node.func.value))
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) \
                and any(isinstance(c, ast.Name) and c.id == kw for c in node.comparators):
            keys.add(node.left.value); handled |= {id(c) for c in node.comparators}
        elif isinstance(node, ast.arg) and node.arg == kw:
            handled.add(id(node))
    uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == kw and id(n) not in handled]
    return None if uses or not keys else keys


KWARGS_KEYS = {"mindspore.set_context": _set_context_keys, "mindspore.context.set_context": _set_context_keys,
               "mindspore.set_auto_parallel_context": _auto_parallel_keys,
               "mindspore.context.set_auto_parallel_context": _auto_parallel_keys}


def check_call(call: dict) -> str | None:
    """None if the call fits the installed signature, else the reason."""
    try:
        obj = resolve_object(call["name"])
    except (ImportError, AttributeError) as e:
        return f"{call['where']}: {call['name']} does not exist in the installed version ({type(e).__name__}: {e})"
    if not callable(obj):
        return f"{call['where']}: {call['name']} is not callable"
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None                      # builtins without a signature: existence is all we can check
    params = sig.parameters.values()
    has_var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    try:
        n_pos = (call["n_pos"] or 0) + (1 if call.get("bound") and inspect.isfunction(obj) else 0)  # self
        if call["n_pos"] is None and any(p.kind is p.VAR_POSITIONAL for p in params):
            n_pos = 0
        # a call without *args/**kwargs spreads must also supply every required parameter
        bind = sig.bind_partial if call.get("spread") else sig.bind
        bind(*([None] * n_pos), **{k: None for k in call["keywords"]})
    except TypeError as e:
        return f"{call['where']}: {call['name']}{sig} rejects positional={call['n_pos']} keywords={call['keywords']}: {e}"
    if not has_var_kw:
        return None
    explicit = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    extra = [k for k in call["keywords"] if k not in explicit]
    if not extra:
        return None
    if call["name"] in KWARGS_KEYS:
        bad = [k for k in extra if k not in KWARGS_KEYS[call["name"]]()]
        return f"{call['where']}: {call['name']} does not recognise {bad}" if bad else None
    literal = _kwargs_literals(obj)
    if literal is not None:
        bad = [k for k in extra if k not in literal]
        return f"{call['where']}: {call['name']} reads only {sorted(literal)} from **kwargs, not {bad}" if bad else None
    if inspect.isclass(obj) and call["name"].startswith("mindformers"):
        known = set()
        for klass in obj.__mro__:
            init = klass.__dict__.get("__init__")
            if init is not None:
                try:
                    known |= {p.name for p in inspect.signature(init).parameters.values()
                              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
                except (TypeError, ValueError):
                    pass
        bad = [k for k in extra if k not in known]
        return f"{call['where']}: no __init__ in {call['name']}'s MRO takes {bad}" if bad else None
    return None


# ---------------------------------------------------------------- tests
def all_calls() -> list[dict]:
    out = []
    for nb in NOTEBOOKS:
        out += notebook_calls(nb)
    for w in WORKERS:
        out += source_calls(w.read_text(), f"mshelpers/workers/{w.name}")
    return out


def test_ascend_paths_call_the_installed_api():
    calls = all_calls()
    names = {c["name"] for c in calls}
    # the collection must see the Ascend paths it is meant to guard, or it guards nothing
    assert any(c["where"].startswith("03_") for c in calls), "no call collected from notebook 03's Ascend cell"
    assert any(c["where"].startswith("07_") for c in calls), "no call collected from notebook 07's Ascend cell"
    assert any("semi_auto_llama" in c["where"] for c in calls), "no call collected from the semi_auto worker"
    assert "mindspore.export" in names and any(n.startswith("mindformers") for n in names), sorted(names)
    problems = [p for p in map(check_call, calls) if p]
    assert not problems, "\n".join(problems)


GOOD = '''
import mindspore as ms
from mindspore import nn
from mindspore.parallel.auto_parallel import AutoParallel
from mindformers.modules.transformer import TransformerOpParallelConfig
ms.set_context(mode=ms.GRAPH_MODE, jit_config={"jit_level": "O2"})
ms.export(net, x, file_name="m", file_format="AIR")
pc = TransformerOpParallelConfig(data_parallel=2, model_parallel=1, micro_batch_num=2)
p = AutoParallel(net, parallel_mode="semi_auto")
p.hsdp(shard_size=-1, threshold=64)
opt = nn.AdamWeightDecay(params, learning_rate=1e-3)
'''


def test_good_source_passes():
    calls = source_calls(GOOD, "good")
    assert {c["name"] for c in calls} >= {"mindspore.set_context", "mindspore.export", "mindspore.nn.AdamWeightDecay",
                                          "mindformers.modules.transformer.TransformerOpParallelConfig",
                                          "mindspore.parallel.auto_parallel.AutoParallel.hsdp"}
    assert [p for p in map(check_call, calls) if p] == []


@pytest.mark.parametrize("old, new, expect", [
    ('jit_config={"jit_level": "O2"}', 'optimize_kernel_cfg_path="bank"', "optimize_kernel_cfg_path"),
    ('file_name="m"', 'filename="m"', "file_name"),
    ("micro_batch_num=2", "micro_batch_nums=2", "micro_batch_nums"),
    ("threshold=64", "threshold=64, stage=1", "stage"),
    ("ms.export(", "ms.export_model(", "does not exist"),
    ("learning_rate=1e-3)", "learning_rate=1e-3, lr=1)", "lr"),
])
def test_a_bogus_keyword_fails(old, new, expect):
    assert old in GOOD
    problems = [p for p in map(check_call, source_calls(GOOD.replace(old, new), "bad")) if p]
    assert len(problems) == 1 and expect in problems[0], problems


def test_a_bogus_keyword_in_a_copy_of_the_worker_fails():
    src = (ROOT / "mshelpers" / "workers" / "semi_auto_llama.py").read_text()
    assert not [p for p in map(check_call, source_calls(src, "copy")) if p]
    line = next(l for l in src.splitlines(keepends=True) if l.startswith("import mindspore as ms"))
    bad = src.replace(line, line + "ms.set_context(optimize_kernel_cfg_path='x')\n", 1)
    assert bad != src
    problems = [p for p in map(check_call, source_calls(bad, "copy")) if p]
    assert len(problems) == 1 and "optimize_kernel_cfg_path" in problems[0], problems
