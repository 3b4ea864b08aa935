"""The README's Python API example runs as written (on synthetic data) and its two commands are
the ones CI and users run."""

import re
from pathlib import Path

import numpy as np

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_example_runs():
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    rng = np.random.default_rng(7)
    beta = rng.normal(size=5)

    def rows(n):
        x = rng.normal(size=(n, 5))
        return x, x @ beta + rng.normal(size=n)

    (x_private, y_private), (x_public, y_public), (x_new, _) = rows(800), rows(10), rows(20)
    scope = {"x_private": x_private, "y_private": y_private, "x_public": x_public,
             "y_public": y_public, "x_new": x_new}
    exec(compile(block, "README.md", "exec"), scope)
    assert scope["y_hat"].shape == (20,) and np.all(np.isfinite(scope["y_hat"]))
    assert scope["posterior"].diagnostics["converged"]


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_command():
    text = README.read_text()
    commands = re.findall(r"^    (python3 -m venv .*)$", text, re.M)[:2]
    assert commands[0].endswith("dpfed simulate") and commands[1].endswith("python -m pytest")
    ci = (README.parent / ".ci" / "run").read_text()
    assert "python -m pytest\n" in ci
