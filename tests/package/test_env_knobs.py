"""Every EP_RT_ variable ep_rt reads is in env.KNOBS (what doctor knows) and in the README's knobs table (or, for a
test mode documented on its own page, that page's knobs table)."""

import re

from ep_rt import env

from ..repo import REPO as ROOT


def test_knobs_are_listed_and_documented():
    read = set()
    for path in [*(ROOT / "ep_rt").rglob("*.py"), ROOT / "_ep_rt_deep_ep.py"]:
        read |= set(re.findall(r'"(EP_RT_[A-Z0-9_]+)"', path.read_text()))
    assert read == set(env.KNOBS), sorted(read ^ set(env.KNOBS))
    tables = ""
    for doc in ("README.md", "docs/CHAOS_TRANSPORT.md"):
        text = (ROOT / doc).read_text()
        tables += text[text.index("## Environment knobs") :]
    assert [k for k in env.KNOBS if f"| `{k}` |" not in tables] == []
