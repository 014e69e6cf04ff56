"""Opt-in: code that says `import deep_ep` gets ep_rt, and a real DeepEP is never shadowed.

Two ways in (README "Switching a DeepEP client to ep_rt"):

* `ep_rt.install_deep_ep_alias()` in the process, before the client imports deep_ep: registers the modules
  deep_ep, deep_ep.buffer and deep_ep.utils (views of ep_rt, ep_rt.buffer and ep_rt.utils), or raises
  DeepEPAliasError if a real DeepEP is installed or already imported.
* EP_RT_DEEP_EP_ALIAS=1 with the startup hook that `python -m ep_rt alias install` writes into site-packages (a
  .pth line that, with the variable set, imports this module and calls boot()): every Python process of that
  environment, spawned workers included, then finds deep_ep through a finder placed after the normal ones, so an
  installed DeepEP still wins (with a warning that the alias was refused). Without the variable the line only
  reads os.environ.

This module lives outside the ep_rt package and uses the standard library only: the startup hook imports it where
the variable is set, and importing ep_rt (hence torch) there would slow down every Python start. ep_rt itself is
imported only when deep_ep is.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
import warnings

ENV = "EP_RT_DEEP_EP_ALIAS"
# deep_ep's modules and the ep_rt modules that stand for them (DeepEP has no others).
TARGETS = {"deep_ep": "ep_rt", "deep_ep.buffer": "ep_rt.buffer", "deep_ep.utils": "ep_rt.utils"}


class DeepEPAliasError(RuntimeError):
    """The deep_ep alias was refused: a real DeepEP is installed or imported."""


class _AliasLoader(importlib.abc.Loader):
    """Makes the module `deep_ep...` a view of its ep_rt module: the same objects under DeepEP's names."""

    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return None  # a plain module; exec_module fills it

    def exec_module(self, module):
        fill_view(module, importlib.import_module(self.target))


def fill_view(module: types.ModuleType, target: types.ModuleType) -> None:
    public = getattr(target, "__all__", None) or [n for n in vars(target) if not n.startswith("_")]
    for name in public:
        setattr(module, name, getattr(target, name))
    module.__all__ = list(public)
    module.__getattr__ = lambda name: getattr(target, name)  # anything else ep_rt's module has (PEP 562)
    module.__ep_rt_target__ = target.__name__
    if module.__name__ == "deep_ep":
        module.__path__ = []  # a package whose only submodules are the aliased ones (found by _AliasFinder)
        module.__version__ = getattr(target, "__version__", None)


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Placed after the standard finders: it is asked only when no real deep_ep was found."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in TARGETS:
            return None
        return importlib.machinery.ModuleSpec(
            fullname, _AliasLoader(TARGETS[fullname]), is_package=fullname == "deep_ep"
        )


def is_alias(module) -> bool:
    return getattr(module, "__ep_rt_target__", None) is not None


def real_deep_ep():
    """Where a real DeepEP is (its origin or location), or None: an imported deep_ep that is not ep_rt's alias,
    else what importlib.util.find_spec finds (not counting this module's own finder)."""
    loaded = sys.modules.get("deep_ep")
    if loaded is not None:
        return None if is_alias(loaded) else (getattr(loaded, "__file__", None) or repr(loaded))
    spec = importlib.util.find_spec("deep_ep")
    if spec is None or isinstance(spec.loader, _AliasLoader):
        return None
    return spec.origin or ", ".join(spec.submodule_search_locations or []) or "an installed deep_ep"


def _refusal(where: str) -> str:
    return (
        f"a real DeepEP is installed ({where}); ep_rt will not shadow it. Import ep_rt directly (import ep_rt "
        f"as deep_ep), or uninstall deep_ep to let the alias give ep_rt to code that says `import deep_ep`."
    )


def install():
    """Register deep_ep, deep_ep.buffer and deep_ep.utils as views of ep_rt; return the deep_ep module.
    Idempotent; raises DeepEPAliasError (nothing registered) if a real DeepEP is installed or imported."""
    where = real_deep_ep()
    if where is not None:
        raise DeepEPAliasError(_refusal(where))
    for name in TARGETS:  # parents first
        if name not in sys.modules:
            spec = _AliasFinder().find_spec(name)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[name] = module
            if "." in name:  # as the import system would: the parent's attribute (deep_ep.buffer)
                setattr(sys.modules["deep_ep"], name.rpartition(".")[2], module)
    add_finder()
    return sys.modules["deep_ep"]


def add_finder() -> None:
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.append(_AliasFinder())


def boot() -> None:
    """The startup hook (the .pth line): with EP_RT_DEEP_EP_ALIAS set (and not 0), let `import deep_ep` find
    ep_rt unless a real DeepEP is installed, which is then used as it is and a warning says so."""
    if os.environ.get(ENV, "").strip().lower() in ("", "0", "false", "no", "off"):
        return
    where = real_deep_ep()
    if where is not None:
        warnings.warn(f"{ENV} is set but {_refusal(where)}", RuntimeWarning, stacklevel=2)
        return
    add_finder()


PTH_NAME = "ep_rt_deep_ep_alias.pth"
# One line, run by site at every interpreter start. Without the variable it reads os.environ and stops: `os` is
# already imported by then, so it imports nothing (this module included; its imports cost ~20 ms). With the
# variable it imports this module only if it is still installed.
PTH_LINE = (
    f'import os; os.environ.get("{ENV}") and __import__("importlib.util").util.find_spec("_ep_rt_deep_ep") '
    f'and __import__("_ep_rt_deep_ep").boot()\n'
)
