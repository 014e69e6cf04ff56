"""The ctypes mirrors of params.h refuse names that are not fields (plain ctypes adds an attribute, so a misspelt
field would silently never reach the kernel): plain assignment and Launcher.set alike, and every field name that
ep_rt's code writes, GPU-only paths included, is a field of the struct it writes (checked from the source)."""

import ast
import ctypes

import pytest

from ep_rt.runtime import abi, launch

from ..repo import REPO

MIRRORS = {
    name: cls
    for name, cls in vars(abi).items()
    if isinstance(cls, type) and issubclass(cls, abi.Mirror) and cls is not abi.Mirror
}


class _Module:
    entry = {"path": "fake.cubin", "blocks": {"k": 128}}

    def function(self, name):
        return f"function {name}"


def test_the_mirrors_are_all_there():
    assert len(MIRRORS) >= 13 and "DispatchParams" in MIRRORS and "ErrorRecord" in MIRRORS
    plain = [
        name
        for name, cls in vars(abi).items()
        if isinstance(cls, type)
        and issubclass(cls, ctypes.Structure)
        and cls.__module__ == abi.__name__
        and not issubclass(cls, abi.Mirror)
    ]
    assert plain == [], f"structs of abi.py that are no Mirror: {plain}"


@pytest.mark.parametrize("name", sorted(MIRRORS))
def test_every_mirror_refuses_a_name_that_is_no_field(name):
    cls = MIRRORS[name]
    s = cls()
    assert not hasattr(s, "__dict__"), f"{name} has an instance __dict__: declare __slots__ = () in its class"
    field = cls._fields_[0][0]
    with pytest.raises(AttributeError, match=name):
        setattr(s, field + "_misspelt", 1)
    assert not hasattr(s, field + "_misspelt")
    # fields are written as ever, by name and by the constructor
    kind = dict(cls._fields_)[field]
    if kind in (ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64):
        setattr(s, field, 7)
        assert getattr(s, field) == 7 and getattr(cls(**{field: 9}), field) == 9
    with pytest.raises(AttributeError):
        cls(**{field + "_misspelt": 1})


def test_nested_structs_and_records_from_memory_refuse_too():
    p = abi.InternodeParams()
    with pytest.raises(AttributeError):
        p.lay.capp = 1
    with pytest.raises(AttributeError):
        p.nvl.record = 1
    raw = ctypes.create_string_buffer(ctypes.sizeof(abi.ErrorRecord))
    rec = abi.ErrorRecord.from_address(ctypes.addressof(raw))
    with pytest.raises(AttributeError):
        rec.detail = 1
    rec.detail0 = 5
    assert abi.ErrorRecord.from_buffer_copy(raw).detail0 == 5


def test_launcher_set_names_the_struct_and_the_nearest_fields():
    k = launch.Launcher(_Module(), "k", abi.DispatchParams)
    assert k.set(rank=3, num_ranks=8) is k and (k.params.rank, k.params.num_ranks) == (3, 8)
    with pytest.raises(AttributeError) as info:
        k.set(rank=1, num_rank=4)
    text = str(info.value)
    assert "DispatchParams has no field 'num_rank'" in text and "'num_ranks'" in text, text
    assert "params.h" in text
    with pytest.raises(AttributeError) as info:
        k.set(zzzz=1)
    assert "DispatchParams has no field 'zzzz'" in str(info.value) and "recv_topk_idx_bits" in str(info.value)
    # a wrong value type is ctypes' TypeError, as before
    with pytest.raises(TypeError):
        k.set(rank="three")


def test_unknown_field_suggests_by_similarity():
    err = abi.unknown_field(abi.LowLatencyParams, "msg_byte")
    assert isinstance(err, AttributeError)
    assert str(err).startswith("LowLatencyParams has no field 'msg_byte'") and "'msg_bytes'" in str(err)


# ---- every field name the code writes, read from the source --------------------------------------------------------
def _mirror_of(node):
    """The mirror an annotation or constructor argument names (`abi.X` / `params.X`), or None."""
    if isinstance(node, ast.Attribute) and node.attr in MIRRORS:
        return MIRRORS[node.attr]
    return None


def _nested(cls):
    """cls and the mirrors of its struct fields, recursively."""
    out = {cls}
    for _, kind in cls._fields_:
        if isinstance(kind, type) and issubclass(kind, abi.Mirror):
            out |= _nested(kind)
    return out


def _flat(targets):
    """Assignment targets with tuples unpacked, nested ones too: `(a.x, a.y), b = ...`."""
    out = []
    for t in targets:
        out += _flat(t.elts) if isinstance(t, (ast.Tuple, ast.List)) else [t]
    return out


def written_field_problems(source: str, where: str):
    """Field names written that no struct they may go to has. The structs a module's Launchers hold are those it
    passes to Launcher(...); `.set(name=...)` keywords and assignments `p.name = ...` to a `p = <...>.params`
    (or to an argument named p) must be fields of one of them; assignments to an argument annotated `abi.X` must be
    fields of X."""
    tree = ast.parse(source)
    launched = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Launcher":
            launched |= {m for a in node.args if (m := _mirror_of(a))}
    launched_fields = set().union(*(abi.field_names(c) for m in launched for c in _nested(m)))
    problems = []
    for node in ast.walk(tree):
        if launched and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "set":
            problems += [
                f"{where}:{node.lineno}: .set({kw.arg}=...) is no field of {sorted(m.__name__ for m in launched)}"
                for kw in node.keywords
                if kw.arg is not None and kw.arg not in launched_fields
            ]
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        bound = {a.arg: _mirror_of(a.annotation) for a in node.args.args if _mirror_of(a.annotation)}
        # a launcher's struct: a name bound to `<...>.params`, or an argument named p (ep_rt's name for the struct
        # a helper fills, e.g. LowLatencyOp._common(p, ...))
        params_names = {a.arg for a in node.args.args if a.arg == "p"}
        for sub in ast.walk(node):
            if isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Attribute) and sub.value.attr == "params":
                params_names |= {t.id for t in sub.targets if isinstance(t, ast.Name)}
        for sub in ast.walk(node):
            targets = []
            if isinstance(sub, (ast.Assign, ast.AugAssign)):
                targets = _flat(sub.targets if isinstance(sub, ast.Assign) else [sub.target])
            for t in targets:
                if not (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)):
                    continue
                if t.value.id in bound and t.attr not in abi.field_names(bound[t.value.id]):
                    problems.append(
                        f"{where}:{t.lineno}: {t.value.id}.{t.attr} is no field of {bound[t.value.id].__name__}"
                    )
                elif t.value.id in params_names and launched and t.attr not in launched_fields:
                    problems.append(
                        f"{where}:{t.lineno}: {t.value.id}.{t.attr} is no field of "
                        f"{sorted(m.__name__ for m in launched)}"
                    )
    return problems


def test_every_field_name_the_code_writes_is_a_field():
    files = [*sorted((REPO / "ep_rt").rglob("*.py")), *sorted((REPO / "tests" / "gpu").rglob("*.py"))]
    problems = []
    for f in files:
        problems += written_field_problems(f.read_text(encoding="utf-8"), str(f.relative_to(REPO)))
    assert problems == []


def test_the_source_check_finds_a_misspelt_field():
    source = """
from ep_rt.runtime import abi
from ep_rt.runtime.launch import Launcher

class Op:
    def __init__(self, module):
        self.k = Launcher(module, "k", abi.LowLatencyParams)

    def call(self, x):
        p = self.k.params
        p.msg_byte = 3
        self.k.set(x=x, num_token=1)
        self._common(p)

    def _common(self, p):
        p.rank, (p.num_rank, p.hidden) = 0, (1, 2)

def fill(lay: abi.InternodeLayout):
    lay.capp = 1
"""
    problems = written_field_problems(source, "snippet")
    assert any("p.msg_byte is no field" in p for p in problems), problems
    assert any(".set(num_token=...) is no field" in p for p in problems), problems
    assert any("lay.capp is no field of InternodeLayout" in p for p in problems), problems
    assert any("p.num_rank is no field" in p for p in problems), problems
    assert len(problems) == 4, problems
