"""The README's test command and .ci/run's are one command: .ci/run runs the README's verbatim."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("Run the tests"):]
    command = re.search(r"```bash\n(.+?)\n```", section, re.S).group(1).strip()
    ci_lines = [line for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
                if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert ci_lines == [command]
    assert "build_cubins.py --install-sites --verify" in command
