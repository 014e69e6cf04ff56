"""tools/gpu_run.sh's steps pick their tests by marker (-m, the markers pyproject.toml registers) or by node id,
never by -k name fragments: a -k matches any test, module or folder whose name holds the fragment (the old
`rest` step's `-k "not layout"` also dropped 44 CPU tests with "layout" or "cubins" in their names), and a renamed
test silently leaves its step. Read from the script's text; nothing runs."""

import re
import sys

import pytest

from ..repo import REPO, collect_ids

if sys.version_info >= (3, 11):
    import tomllib
else:
    tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml on Python 3.10 needs tomli")

SCRIPT = REPO / "tools" / "gpu_run.sh"
WORDS = {"and", "or", "not"}


def pytest_commands(text: str) -> list[str]:
    """Each logical line (backslash continuations joined) that runs pytest, from pytest on (so `timeout -k 10`
    before it is no pytest option)."""
    joined = re.sub(r"\\\n", " ", text)
    return [
        line[line.index("pytest") :]
        for line in joined.splitlines()
        if "pytest" in line and not line.lstrip().startswith("#")
    ]


def keyword_options(command: str) -> list[str]:
    return re.findall(r"(?<!\S)(-k\S*|--keyword\S*)", command)


def marker_names(command: str) -> set[str]:
    """The names in each -m expression of one command; an expression the caller gives at run time ("${CU12_MARK:?...}")
    has none to check here (one that selects no test is refused before any step: selects_some in the script)."""
    names = set()
    for quoted2, quoted1, bare in re.findall(r"(?<!\S)-m\s+(?:\"([^\"]*)\"|'([^']*)'|(\S+))", command):
        if (quoted2 or quoted1 or bare).startswith("${"):
            continue
        names |= set(re.findall(r"[A-Za-z_]\w*", quoted2 or quoted1 or bare)) - WORDS
    return names


def registered_markers() -> set[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
    return {m.split(":")[0].strip() for m in config["markers"]}


def test_no_step_selects_by_name_fragment():
    commands = pytest_commands(SCRIPT.read_text(encoding="utf-8"))
    assert len(commands) > 20, "the script's pytest steps were not found: the parser here needs updating"
    found = {c: keyword_options(c) for c in commands if keyword_options(c)}
    assert not found, f"steps select by -k: {found}; mark the tests (pyproject.toml's markers) and use -m"


def test_every_marker_a_step_names_is_registered_and_marks_some_test():
    used = set().union(*map(marker_names, pytest_commands(SCRIPT.read_text(encoding="utf-8"))))
    registered = registered_markers()
    assert used, "no -m in the script: the parser here needs updating"
    assert used <= registered, f"gpu_run.sh names markers pyproject.toml does not register: {used - registered}"
    sources = "".join(p.read_text(encoding="utf-8") for p in (REPO / "tests").rglob("*.py"))
    unused = {m for m in registered if not re.search(rf"pytest\.mark\.{m}\b", sources)}
    assert not unused, f"registered markers that mark no test (a step selecting by them runs nothing): {unused}"


def test_the_parsers_see_what_they_look_for():
    text = (
        '    a) run a 10 python3 -m pytest -q -rs tests -k "not wheel" ;;\n'
        "    b) run b 10 setsid timeout -k 10 python3 -m pytest -q \\\n"
        '             -m "not bench and not (soak or smoke)" tests ;;\n'
        "    # c) python3 -m pytest -k old ;;\n"
    )
    a, b = pytest_commands(text)
    assert keyword_options(a) == ["-k"] and keyword_options(b) == []
    assert marker_names(a) == set() and marker_names(b) == {"bench", "soak", "smoke"}
    assert keyword_options("pytest --keyword=x") == ["--keyword=x"] and marker_names("pytest -m suite x") == {"suite"}


def test_internode_each_runs_every_internode_test_but_the_sixteen_process_one_fault_tests_first():
    """internode_each's list (the function internode_ids of gpu_run.sh, run here with bash): every test id of
    tests/gpu/test_internode_gpu.py that is not marked sixteen, each once, the killed-node and missing-peer tests
    before the rest (they must run while the machine is fresh, and alone)."""
    import shutil
    import subprocess

    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    fn = re.search(r"^internode_ids\(\) \{.*?^\}", SCRIPT.read_text(), flags=re.S | re.M)
    assert fn, "gpu_run.sh has no internode_ids function"
    env = {"PATH": f"{sys.executable.rsplit('/', 1)[0]}:/usr/bin:/bin"}
    done = subprocess.run(
        ["bash", "-c", fn.group(0).replace("python3 ", f"{sys.executable} ") + "\ninternode_ids"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    ids = done.stdout.split()
    source = (REPO / "tests" / "gpu" / "test_internode_gpu.py").read_text()
    want = len(re.findall(r"^def test_", source, flags=re.M))  # one test per function ...
    want += sum(len(re.findall(r'"[^"]+"', m)) - 1 for m in re.findall(r"ids=\[([^\]]*)\]", source))  # ... or per id
    assert len(ids) == len(set(ids)) == want - 1, (done.stderr, ids)  # all but the sixteen-process test
    assert not any("sixteen" in i for i in ids), ids
    faults = [k for k, i in enumerate(ids) if "killed" in i or "missing" in i]
    assert faults == list(range(3)), ids
    # the per-case module's default variant (as internode_cases) in one pytest after them, in both each-steps
    text = SCRIPT.read_text()
    for step in ("internode_each_cases", "cu12_internode_each_cases"):
        assert step_selection(text, step) == step_selection(text, "internode_cases"), step


def step_selection(text: str, step: str) -> tuple:
    """(the -m expression, the test files) of the pytest command that `run <step> ...` runs in the script."""
    joined = re.sub(r"\\\n", " ", text)
    found = re.search(rf"(?<![\w$])run {re.escape(step)} [^;]*?pytest (.*?)(;;|$)", joined, flags=re.M)
    assert found, f"no step {step} that runs pytest"
    command = found.group(1)
    marker = re.search(r'(?<!\S)-m\s+"([^"]*)"', command)
    return (marker.group(1) if marker else None), tuple(re.findall(r"tests/gpu/\S+?\.py", command))


def collect_step(text: str, step: str) -> list:
    """The test ids the step's pytest command would run (its -m, or pyproject's default, on its files)."""
    marker, files = step_selection(text, step)
    return collect_ids(*(("-m", marker) if marker else ()), *files)


INTERNODE_CASES = "tests/gpu/test_internode_cases_gpu.py"


def test_the_internode_case_steps_run_every_item_once_and_2x8_only_in_its_own_steps():
    """Issue 21's pools: internode_cases runs the default variant (and so do internode_core and the each-steps),
    internode_variants the aggressive and chaos pools of 2x2, 4x1, 2x4 and 4x2, internode16_aggressive and
    internode16_chaos the 2x8 ones: together every item of the per-case module, each once."""
    text = SCRIPT.read_text(encoding="utf-8")
    ids = collect_ids(INTERNODE_CASES)
    steps = ("internode_cases", "internode_variants", "internode16_aggressive", "internode16_chaos")
    picked = {step: collect_step(text, step) for step in steps}
    assert sorted(sum(picked.values(), [])) == sorted(ids), {k: len(v) for k, v in picked.items()}
    assert not any("-aggressive-" in i or "-chaos-" in i for i in picked["internode_cases"]), picked
    assert all("-aggressive-" in i or "-chaos-" in i for i in picked["internode_variants"]), picked
    assert all("[2x8-aggressive-" in i for i in picked["internode16_aggressive"]), picked
    assert all("[2x8-chaos-" in i for i in picked["internode16_chaos"]), picked
    core = [i for i in collect_step(text, "internode_core") if i.startswith(INTERNODE_CASES)]
    assert core == picked["internode_cases"]


def test_the_ll_node_steps_run_every_ll_nodes_test_once_and_the_one_node_steps_none():
    """ll_nodes (4x1 and the fault tests on emulated nodes), ll_nodes8 (2x4, 4x2), ll16 and ll16_chaos (2x8), and
    the packed layout's steps (ll_packed: its 2- and 4-rank pools, ll_packed8, ll_packed16, ll_packed_faults):
    together every test marked ll_nodes, each once; ll, gpu_core and cu12_net keep their one-node tests and take
    none of them."""
    text = SCRIPT.read_text(encoding="utf-8")
    marked = collect_ids("-m", "ll_nodes", "tests/gpu")
    packed_steps = ("ll_packed", "ll_packed8", "ll_packed16", "ll_packed_faults")
    steps = ("ll_nodes", "ll_nodes8", "ll16", "ll16_chaos") + packed_steps
    picked = {step: collect_step(text, step) for step in steps}
    assert all(picked.values()), {k: len(v) for k, v in picked.items()}
    assert sorted(sum(picked.values(), [])) == sorted(marked), {k: len(v) for k, v in picked.items()}
    assert any("test_killed_peer[ll-True-2x2-chaos]" in i for i in picked["ll_nodes"]), picked["ll_nodes"]
    assert any("shrink_mode_masks_a_silent_rank[2x1-chaos]" in i for i in picked["ll_nodes"]), picked["ll_nodes"]
    assert not any("packed" in i for i in picked["ll_nodes"]), picked["ll_nodes"]
    assert all("[2x8-" in i for i in picked["ll16"] + picked["ll16_chaos"]), picked
    packed = sum((picked[s] for s in packed_steps), [])
    assert sorted(packed) == sorted(collect_ids("-m", "ll_packed", "tests/gpu")) and all("packed" in i for i in packed)
    assert all("test_low_latency_packed_gpu.py" in i for i in picked["ll_packed"]), picked["ll_packed"]
    assert all(("[2x4-" in i or "[4x2-" in i) for i in picked["ll_packed8"]), picked["ll_packed8"]
    assert all("[2x8-" in i for i in picked["ll_packed16"]), picked["ll_packed16"]
    assert any("test_killed_peer[ll-True-2x2-packed-chaos]" in i for i in picked["ll_packed_faults"]), picked
    assert any("shrink_mode_masks_a_silent_rank[1x2-packed]" in i for i in picked["ll_packed_faults"]), picked
    one_node = {"ll": "shrink_mode_masks_a_silent_rank[one_node]", "gpu_core": "test_killed_peer[ll-True]"}
    for step in ("ll", "gpu_core", "cu12_net"):
        ids = collect_step(text, step)
        assert ids and not set(ids) & set(marked), (step, sorted(set(ids) & set(marked)))
        assert step not in one_node or any(i.endswith(one_node[step]) for i in ids), (step, ids)


def test_the_three_short_ll_node_steps_are_ll_nodes_cut_in_three():
    """ll_nodes41, ll_nodes41_chaos and ll_nodes_faults (for sessions with too little device time for ll_nodes whole)
    run exactly ll_nodes's tests, each once: 4x1 over P2P puts, 4x1 through the chaos transport, the fault tests."""
    text = SCRIPT.read_text(encoding="utf-8")
    whole = collect_step(text, "ll_nodes")
    parts = {step: collect_step(text, step) for step in ("ll_nodes41", "ll_nodes41_chaos", "ll_nodes_faults")}
    assert all(parts.values()), {k: len(v) for k, v in parts.items()}
    assert sorted(sum(parts.values(), [])) == sorted(whole), {k: len(v) for k, v in parts.items()}
    assert all("[4x1-" in i and "-chaos-" not in i for i in parts["ll_nodes41"]), parts["ll_nodes41"]
    assert all("[4x1-chaos-" in i for i in parts["ll_nodes41_chaos"]), parts["ll_nodes41_chaos"]
    assert not any("test_low_latency_nodes_gpu" in i for i in parts["ll_nodes_faults"]), parts["ll_nodes_faults"]
