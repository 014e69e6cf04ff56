"""Every public method of ep_rt.Buffer (and its constructor) has a docstring of its own, in DeepEP's terms: each
parameter is described in it, except for DeepEP's internode entry points, which name the method whose arguments
they take."""

import inspect
import re

import pytest

from ep_rt import Buffer

# entry point -> the method whose docstring describes its arguments
DELEGATES = {"internode_dispatch": "dispatch", "internode_combine": "combine"}


def public_methods():
    out = {}
    for name, obj in vars(Buffer).items():
        if name.startswith("_") and name != "__init__":
            continue
        func = obj.fget if isinstance(obj, property) else getattr(obj, "__func__", obj)
        if callable(func):
            out[name] = func
    return out


def test_the_list_is_complete():
    names = set(public_methods())
    assert {
        "__init__",
        "dispatch",
        "combine",
        "get_dispatch_layout",
        "low_latency_dispatch",
        "low_latency_combine",
        "destroy",
        "runtime",
        "is_internode",
        "set_kernel_timer",
    } <= names
    assert len(names) >= 29, sorted(names)  # 29 as of this writing, the constructor included
    assert Buffer.__doc__ and "Attributes:" in Buffer.__doc__


@pytest.mark.parametrize("name", sorted(public_methods()))
def test_every_public_method_has_a_docstring_describing_its_parameters(name):
    func = public_methods()[name]
    doc = func.__doc__  # its own, not one inspect.getdoc would inherit (object.__init__'s)
    assert doc and len(doc.split()) >= 8, f"Buffer.{name} has no docstring (or a few words only)"
    params = [p for p in inspect.signature(func).parameters if p not in ("self", "cls")]
    if name in DELEGATES:
        assert f"{DELEGATES[name]}()" in doc, f"Buffer.{name}: its docstring must name {DELEGATES[name]}()"
        return
    undocumented = [p for p in params if not re.search(rf"^\s+{re.escape(p)}( \([^)]*\))?:", doc, re.M)]
    assert undocumented == [], f"Buffer.{name}: no 'name: ...' line in its docstring for {undocumented}"
