"""The import rules of the package layout (README "Layout"), drawn from the code: every module is parsed, every
import (function-local ones too) is mapped onto a wing, and the edges must point downward; no import cycles;
only runtime/driver.py names cuda.bindings."""

import ast
from pathlib import Path

from ..repo import REPO as ROOT

PKG = ROOT / "ep_rt"

API = {
    "ep_rt.config",
    "ep_rt.config_tables",
    "ep_rt.deepep_hints",
    "ep_rt.config_file",
    "ep_rt.handles",
    "ep_rt.events",
    "ep_rt.validate",
    "ep_rt.utils",
    "ep_rt.ht_op",
}
# The Buffer and its other face: deep_ep_runtime.py is `Buffer.runtime` (DeepEP's C++ runtime methods), answered from
# the Buffer's own state, so it shares the Buffer's private names; call_guard.py wraps the Buffer's calls (threads,
# interrupts) and reads a few of its names.
TOP = {"ep_rt", "ep_rt.buffer", "ep_rt.deep_ep_runtime", "ep_rt.buffer_plan", "ep_rt.buffer_memory", "ep_rt.call_guard"}
# What each wing may import, downward only. cli is the top: it may use anything.
# "interface" is runtime/abi.py alone, the mirrors of params.h: it imports nothing of ep_rt, so every wing but the
# reference may name the kernel interface's constants (errors.py decodes error records by their names).
ALLOWED = {
    "interface": {"interface"},
    "base": {"interface", "base"},
    "runtime": {"interface", "base", "runtime"},
    "transport": {"interface", "base", "runtime", "transport"},
    "api": {"interface", "base", "runtime", "transport", "api"},
    "ops": {"interface", "base", "runtime", "transport", "api", "ops"},
    "top": {"interface", "base", "runtime", "transport", "api", "ops", "top"},
    "reference": {"reference"},
    # testing also reads the runtime's own counters (memory.py: bytes ep_rt holds), never the transports or ops
    "testing": {"interface", "base", "runtime", "api", "top", "reference", "testing"},
    "cli": {"interface", "base", "runtime", "transport", "api", "ops", "top", "reference", "testing", "cli"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def wing(mod: str) -> str:
    if mod == "ep_rt.runtime.abi":
        return "interface"
    if mod in ("ep_rt.errors", "ep_rt.env", "ep_rt.installing"):
        return "base"
    if mod in API:
        return "api"
    if mod in TOP:
        return "top"
    if mod in ("ep_rt.__main__",):
        return "cli"
    if mod == "ep_rt.reference_ll":
        return "reference"
    part = mod.split(".")[1]
    if part in ("runtime", "transport", "ops", "reference", "testing", "cli"):
        return part
    raise AssertionError(f"{mod} belongs to no wing: add it to tests/package/test_layering.py")


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


def imports_of(mod: str):
    """(imported ep_rt module, line) pairs, and every top-level module name imported from outside ep_rt."""
    path = MODULES[mod]
    is_pkg = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    inner, outer = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                (inner if a.name.split(".")[0] == "ep_rt" else outer).append((a.name, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                target = node.module
                if target.split(".")[0] != "ep_rt":
                    outer.append((target, node.lineno))
                    continue
            else:
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                sub = f"{target}.{a.name}"
                inner.append((sub if sub in MODULES else target, node.lineno))
    return [(m if m in MODULES else m.rsplit(".", 1)[0], line) for m, line in inner], outer


def test_every_module_has_a_wing_and_imports_only_downward():
    problems = []
    for mod in sorted(MODULES):
        w = wing(mod)
        inner, _ = imports_of(mod)
        for target, line in inner:
            tw = wing(target)
            if tw not in ALLOWED[w]:
                problems.append(f"{mod}:{line} ({w}) imports {target} ({tw})")
            # (an op's own part, ops.<op>_<part>, e.g. ops.internode_rounds, is imported by that op alone)
            own_part = target.startswith(mod + "_")
            if w == "ops" and tw == "ops" and target != mod and not own_part:
                problems.append(f"{mod}:{line}: ops never import each other ({target})")
    assert not problems, "\n".join(problems)


def test_no_import_cycles():
    graph = {mod: {t for t, _ in imports_of(mod)[0] if t != mod} for mod in MODULES}
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(graph[m]):
            if t not in state:
                visit(t)
            elif state[t] == "open":
                cycles.append(" -> ".join(stack[stack.index(t) :] + [t]))
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "\n".join(cycles)


def test_only_the_driver_names_cuda_bindings():
    users = sorted(mod for mod in MODULES if any(name.startswith("cuda") for name, _ in imports_of(mod)[1]))
    assert users == ["ep_rt.runtime.driver"], users


def test_the_reference_imports_only_torch():
    """Besides the standard library: the oracle must run wherever torch does."""
    import sys

    for mod in MODULES:
        if wing(mod) == "reference":
            outer = {name.split(".")[0] for name, _ in imports_of(mod)[1]} - set(sys.stdlib_module_names)
            assert outer <= {"torch"}, (mod, outer)


# ---- private names stay in their wing ------------------------------------------------------------------------------
# The rule: a private name of ep_rt (one leading underscore, not a dunder) is used only inside the wing whose modules
# define it. Outside that wing no module reads or writes `obj._name` (obj other than self / cls), calls getattr /
# setattr / hasattr / delattr(obj, "_name"), or imports `_name`. A wing defines a name when one of its modules does:
# `def _name` / `class _name`, a module- or class-level assignment, `self._name = ...` / `cls._name = ...`, a
# __slots__ entry, or an import bound to `_name`. Names no ep_rt module defines (torch.cuda._sleep, os._exit) are
# other projects' business, and the namedtuple API (_fields, _replace, _asdict, _make, _field_defaults) is public
# by Python's convention. A private name defined in two wings counts as the other wing's wherever it is used on
# another object: rename one. tests/ are outside the rule: a test may reach into privates to set up a state.
NAMEDTUPLE_API = {"_fields", "_replace", "_asdict", "_make", "_field_defaults"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in NAMEDTUPLE_API


def _own(node) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def private_names_defined(tree) -> set:
    names = set()

    def scope(body):
        for st in body:
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _private(st.name):
                names.add(st.name)
            if isinstance(st, ast.ClassDef):
                scope(st.body)
            elif isinstance(st, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = st.targets if isinstance(st, ast.Assign) else [st.target]
                names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name) and _private(n.id))
                if any(isinstance(t, ast.Name) and t.id == "__slots__" for t in targets):
                    names.update(
                        n.value
                        for n in ast.walk(st.value)
                        if isinstance(n, ast.Constant) and isinstance(n.value, str) and _private(n.value)
                    )
            elif isinstance(st, (ast.Import, ast.ImportFrom)):
                names.update(b for a in st.names if _private(b := a.asname or a.name.split(".")[0]))
            elif isinstance(st, (ast.If, ast.Try)):
                scope(st.body)
                scope(getattr(st, "orelse", []))

    scope(tree.body)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(node.name):
            names.add(node.name)  # methods and helpers at any depth
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and _own(node.value)
            and _private(node.attr)
        ):
            names.add(node.attr)
    return names


def private_names_used(tree):
    """(name, line, how) of every private name this module uses on something not its own."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and not _own(node.value):
            yield node.attr, node.lineno, ast.unparse(node)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
            and not _own(node.args[0])
        ):
            yield node.args[1].value, node.lineno, ast.unparse(node)
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                if _private(a.name):
                    yield a.name, node.lineno, f"from {'.' * node.level}{node.module or ''} import {a.name}"


def private_access_problems(sources: dict) -> list:
    """sources: {module name: source text}. Every use of another wing's private name, as 'module:line ...'."""
    trees = {mod: ast.parse(text) for mod, text in sources.items()}
    by_wing = {}
    for mod, tree in trees.items():
        by_wing.setdefault(wing(mod), set()).update(private_names_defined(tree))
    problems = []
    for mod, tree in sorted(trees.items()):
        w = wing(mod)
        for name, line, text in private_names_used(tree):
            owners = sorted(other for other, names in by_wing.items() if other != w and name in names)
            if owners:
                problems.append(f"{mod}:{line} ({w}) uses {text}: {name} is private to {', '.join(owners)}")
    return problems


def test_no_module_uses_a_private_name_of_another_wing():
    sources = {mod: path.read_text(encoding="utf-8") for mod, path in MODULES.items()}
    problems = private_access_problems(sources)
    assert not problems, "\n".join(problems)


def test_the_private_name_rule_finds_each_kind_of_use():
    sources = {
        "ep_rt.buffer": "class Buffer:\n    __slots__ = ('_kept',)\n    def __init__(self):\n        self._ht = 1\n"
        "    def _live(self):\n        return self._ht\n_TABLE = {}\n",
        "ep_rt.ops.layout": "def f(buf):\n    return buf._ht, buf._fields, buf._replace()\n",
        "ep_rt.testing.bench": "import torch\nfrom ..buffer import _TABLE\n\ndef g(buffer, t):\n"
        "    buffer._ht.timer = t\n    setattr(buffer, '_kept', 1)\n    buffer._live()\n"
        "    torch.cuda._sleep(1)\n",
    }
    problems = private_access_problems(sources)
    assert sorted(p.split(" uses ")[1].split(": ")[0] for p in problems) == [
        "buf._ht",
        "buffer._ht",
        "buffer._live",
        "from ..buffer import _TABLE",
        "setattr(buffer, '_kept', 1)",
    ], problems
    assert "ep_rt.ops.layout:2 (ops) uses buf._ht: _ht is private to top" in problems
