"""`import deep_ep` gets ep_rt when asked (ep_rt.install_deep_ep_alias(), or EP_RT_DEEP_EP_ALIAS=1 with the
startup hook), and never when a real DeepEP is installed. Each case runs in a fresh interpreter, so sys.modules
starts clean; a stand-in 'real' DeepEP is a deep_ep package in a temporary folder on PYTHONPATH."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ..repo import REPO as ROOT


def run(code, tmp_path, extra_path=(), env=None):
    environ = {k: v for k, v in os.environ.items() if k != "EP_RT_DEEP_EP_ALIAS"}
    # The caller's PYTHONPATH stays (after ours): megatron-core may be installed in a folder of its own.
    environ["PYTHONPATH"] = os.pathsep.join([*map(str, extra_path), str(ROOT), os.environ.get("PYTHONPATH", "")])
    environ.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=tmp_path, env=environ
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture
def real_deep_ep(tmp_path):
    """A folder holding a package named deep_ep (what an installed DeepEP looks like to the import system)."""
    folder = tmp_path / "site_with_deepep"
    (folder / "deep_ep").mkdir(parents=True)
    (folder / "deep_ep" / "__init__.py").write_text("REAL = True\n")
    return folder


def test_install_gives_deep_ep_names_to_ep_rt(tmp_path):
    run(
        """
        import ep_rt
        mod = ep_rt.install_deep_ep_alias()
        import deep_ep
        from deep_ep import Buffer, Config, EventOverlap, topk_idx_t
        from deep_ep.buffer import Buffer as B2, Config as C2
        from deep_ep.utils import EventHandle, EventOverlap as E2, check_nvlink_connections
        import deep_ep.utils
        assert mod is deep_ep and Buffer is B2 is ep_rt.Buffer and Config is C2 is ep_rt.Config
        assert EventOverlap is E2 is ep_rt.EventOverlap and EventHandle is ep_rt.EventHandle
        assert topk_idx_t is ep_rt.topk_idx_t and deep_ep.utils.check_nvlink_connections is check_nvlink_connections
        assert deep_ep.buffer.Buffer is Buffer                      # submodules are attributes too
        assert ep_rt.install_deep_ep_alias() is deep_ep             # idempotent
        try:
            from deep_ep import HybridEPBuffer                      # Megatron probes for this: ImportError
        except ImportError:
            pass
        else:
            raise AssertionError("HybridEPBuffer should not exist")
        try:
            import deep_ep.ops                                      # DeepEP has no such module
        except ModuleNotFoundError:
            pass
        else:
            raise AssertionError("deep_ep.ops should not import")
        import importlib.util
        assert importlib.util.find_spec("deep_ep").name == "deep_ep"
        """,
        tmp_path,
    )


def test_without_the_alias_there_is_no_deep_ep(tmp_path):
    run(
        """
        import ep_rt
        try:
            import deep_ep
        except ModuleNotFoundError:
            pass
        else:
            raise AssertionError("deep_ep imported without the alias")
        """,
        tmp_path,
    )


def test_install_refuses_when_a_real_deep_ep_is_installed(tmp_path, real_deep_ep):
    run(
        f"""
        import sys, ep_rt, _ep_rt_deep_ep
        try:
            ep_rt.install_deep_ep_alias()
        except _ep_rt_deep_ep.DeepEPAliasError as e:
            assert {str(real_deep_ep)!r} in str(e) and "will not shadow" in str(e), e
        else:
            raise AssertionError("the alias shadowed a real DeepEP")
        assert "deep_ep" not in sys.modules
        import deep_ep
        assert deep_ep.REAL
        """,
        tmp_path,
        extra_path=[real_deep_ep],
    )


def test_install_refuses_when_a_real_deep_ep_is_already_imported(tmp_path, real_deep_ep):
    run(
        """
        import deep_ep, ep_rt, _ep_rt_deep_ep
        try:
            ep_rt.install_deep_ep_alias()
        except _ep_rt_deep_ep.DeepEPAliasError:
            pass
        else:
            raise AssertionError("the alias replaced an imported DeepEP")
        assert deep_ep.REAL
        """,
        tmp_path,
        extra_path=[real_deep_ep],
    )


def _site_with_hook(tmp_path):
    from ep_rt.cli import alias

    site_dir = tmp_path / "site"
    site_dir.mkdir()
    path = alias.install(site_dir)
    assert path.read_text() == alias.hook.PTH_LINE
    return site_dir


HOOKED = """
    import site, sys
    site.addsitedir({site!r})   # runs the .pth line, as at interpreter start for site-packages
    assert "torch" not in sys.modules and "ep_rt" not in sys.modules  # the hook itself imports neither
    {body}
    """


def test_startup_hook_with_the_variable_gives_ep_rt(tmp_path):
    site_dir = _site_with_hook(tmp_path)
    run(
        HOOKED.format(
            site=str(site_dir),
            body=textwrap.dedent("""
        from deep_ep import Buffer
        from deep_ep.utils import EventOverlap
        import ep_rt
        assert Buffer is ep_rt.Buffer and EventOverlap is ep_rt.EventOverlap
    """).replace("\n", "\n    "),
        ),
        tmp_path,
        env={"EP_RT_DEEP_EP_ALIAS": "1"},
    )


def test_startup_hook_without_the_variable_does_nothing(tmp_path):
    site_dir = _site_with_hook(tmp_path)
    run(
        HOOKED.format(
            site=str(site_dir),
            body=textwrap.dedent("""
        try:
            import deep_ep
        except ModuleNotFoundError:
            pass
        else:
            raise AssertionError("deep_ep imported without EP_RT_DEEP_EP_ALIAS")
    """).replace("\n", "\n    "),
        ),
        tmp_path,
    )


def test_startup_hook_lets_a_real_deep_ep_win_and_says_so(tmp_path, real_deep_ep):
    site_dir = _site_with_hook(tmp_path)
    proc = run(
        HOOKED.format(site=str(site_dir), body="import deep_ep; assert deep_ep.REAL"),
        tmp_path,
        extra_path=[real_deep_ep],
        env={"EP_RT_DEEP_EP_ALIAS": "1"},
    )
    assert "will not shadow" in proc.stderr and str(real_deep_ep) in proc.stderr


def test_hook_line_is_harmless_once_ep_rt_is_gone(tmp_path):
    from ep_rt.cli import alias

    site_dir = _site_with_hook(tmp_path)
    environ = dict(os.environ, PYTHONPATH="", EP_RT_DEEP_EP_ALIAS="1")
    code = f"import site; site.addsitedir({str(site_dir)!r}); print('fine')"
    proc = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, cwd=tmp_path, env=environ)
    assert proc.returncode == 0 and proc.stdout.strip() == "fine" and "Error" not in proc.stderr, proc.stderr
    assert alias.remove(site_dir) and not alias.hook_path(site_dir).exists() and not alias.remove(site_dir)


def test_alias_command_status_and_install(tmp_path, capsys):
    from ep_rt.cli import main

    assert main(["alias", "install", "--site-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "wrote" in out and "startup hook: installed" in out
    assert main(["alias", "remove", "--site-dir", str(tmp_path)]) == 0
    assert "not installed" in capsys.readouterr().out


def test_megatron_sees_deep_ep_through_the_alias(tmp_path):
    """Megatron-Core's fused_a2a imports `from deep_ep import Buffer` and `from deep_ep.utils import EventHandle,
    EventOverlap` at import time; through the alias it finds ep_rt's."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install '.[megatron]')")
    run(
        """
        import ep_rt
        ep_rt.install_deep_ep_alias()
        import megatron.core.transformer.moe.fused_a2a as fa
        assert fa.HAVE_DEEP_EP and fa.Buffer is ep_rt.Buffer and fa.EventOverlap is ep_rt.EventOverlap
        assert fa.fused_dispatch is not None and fa.fused_combine is not None and not fa.HAVE_HYBRIDEP
        """,
        tmp_path,
    )


# ---- the hook's cost and its removal, in a real environment --------------------------------------------------
# A bare venv (no pip, no torch) with ep_rt's wheel installed by this interpreter's pip (--python), so site runs
# the .pth at interpreter start exactly as in a user's environment.


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("alias_wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.fail(f"building the wheel failed:\n{proc.stdout}\n{proc.stderr}")
    (found,) = out.glob("*.whl")
    return found


def make_env(folder, wheel):
    """(python, site-packages) of a fresh venv holding ep_rt's wheel (no dependencies: the hook needs none)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        check=True,
        capture_output=True,
    )
    site_dir = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return python, Path(site_dir)


@pytest.fixture(scope="module")
def env_with_ep_rt(wheel, tmp_path_factory):
    return make_env(tmp_path_factory.mktemp("alias_env") / "venv", wheel)


def plain_env():
    return {k: v for k, v in os.environ.items() if k not in ("EP_RT_DEEP_EP_ALIAS", "PYTHONPATH")}


def modules_at_start(python, **extra):
    code = "import sys; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, check=True, env={**plain_env(), **extra}
    ).stdout.split()
    return set(out)


def test_the_hook_line_imports_nothing_without_the_variable(env_with_ep_rt):
    from ep_rt.cli import alias

    python, site_dir = env_with_ep_rt
    alias.remove(site_dir)
    without = modules_at_start(python)
    alias.install(site_dir)
    try:
        assert modules_at_start(python) == without  # the line only read os.environ
        active = modules_at_start(python, EP_RT_DEEP_EP_ALIAS="1")
        assert "_ep_rt_deep_ep" in active and "torch" not in active and "ep_rt" not in active
    finally:
        alias.remove(site_dir)


def _imports_of_the_line(environ: dict) -> list[str]:
    """Run the .pth line as site.py does (exec), with an __import__ that records and hands back stand-ins."""
    import types

    import _ep_rt_deep_ep as hook

    seen = []

    def record(name, *args, **kwargs):
        seen.append(name)
        if name == "os":
            return types.SimpleNamespace(environ=environ)
        module = types.SimpleNamespace(boot=lambda: seen.append("boot()"))
        module.util = types.SimpleNamespace(find_spec=lambda _: True)
        return module

    exec(hook.PTH_LINE, {"__builtins__": {"__import__": record}})
    return seen


def test_the_hook_line_costs_one_environment_lookup_without_the_variable():
    """What a start pays for the line without EP_RT_DEEP_EP_ALIAS: `import os` (already in sys.modules at site time)
    and one dict lookup, nothing else. Counted, not timed: the hook before imported this module at every start
    (+27..31 ms CPU here), and a CPU-time bound on `python -c pass` proved too noisy for CI's 2 cores."""
    assert _imports_of_the_line({}) == ["os"]
    assert _imports_of_the_line({"EP_RT_DEEP_EP_ALIAS": "1"}) == ["os", "importlib.util", "_ep_rt_deep_ep", "boot()"]


def test_pip_uninstall_removes_the_hook(wheel, tmp_path):
    from ep_rt.cli import alias

    python, site_dir = make_env(tmp_path / "venv", wheel)
    path = alias.install(site_dir)
    assert path.is_file()
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "uninstall", "-y", "-q", "ep-rt"],
        check=True,
        capture_output=True,
    )
    assert not path.exists() and not (site_dir / "_ep_rt_deep_ep.py").exists()
    assert not list(site_dir.glob("ep_rt*"))


def test_alias_remove_takes_the_record_line_away_too(tmp_path):
    """Without pip: a site-packages holding an ep-rt dist-info, as pip leaves it."""
    from ep_rt.cli import alias

    site_dir = tmp_path / "site"
    info = site_dir / "ep_rt-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-rt\nVersion: 0.1.0\n")
    record = "_ep_rt_deep_ep.py,sha256=abc,10\nep_rt-0.1.0.dist-info/METADATA,,\nep_rt-0.1.0.dist-info/RECORD,,\n"
    (info / "RECORD").write_text(record)
    alias.install(site_dir)
    alias.install(site_dir)  # idempotent: one line
    assert alias.is_registered(site_dir)
    assert any("removed by `pip uninstall ep-rt`" in line for line in alias.status_lines(site_dir))
    rows = (info / "RECORD").read_text().splitlines()
    assert rows[:3] == record.splitlines() and len(rows) == 4 and rows[3].startswith(alias.hook.PTH_NAME + ",sha256=")
    assert alias.remove(site_dir) and (info / "RECORD").read_text() == record
    other = tmp_path / "elsewhere"  # no ep-rt there: the file alone, and status says who removes it
    other.mkdir()
    alias.install(other)
    assert not alias.is_registered(other)
    assert any("only `alias remove` removes it" in line for line in alias.status_lines(other))
