"""The import rules of the package layout (README "Layout"), drawn from the code: every module is parsed, every
import (function-local ones too) is mapped onto a wing, and the edges must point downward; no import cycles;
only runtime/driver.py names cuda.bindings."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "ep_rt"

API = {"ep_rt.config", "ep_rt.config_tables", "ep_rt.config_file", "ep_rt.handles", "ep_rt.events", "ep_rt.validate",
       "ep_rt.deep_ep_runtime",
       "ep_rt.utils"}
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
    if mod in ("ep_rt", "ep_rt.buffer"):
        return "top"
    if mod in ("ep_rt.__main__",):
        return "cli"
    if mod == "ep_rt.reference_ll":
        return "reference"
    part = mod.split(".")[1]
    if part in ("runtime", "transport", "ops", "reference", "testing", "cli"):
        return part
    raise AssertionError(f"{mod} belongs to no wing: add it to tests/test_layering.py")


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
                base = base[:len(base) - (node.level - 1)]
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
            if w == "ops" and tw == "ops" and target != mod:
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
                cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
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
