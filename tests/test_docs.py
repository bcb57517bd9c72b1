"""The project's documents name what exists: settings the code reads, scripts, results."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/gpu.md", "benchmarks/README.md")
# Read by the package for its own tests only (a pause inside a checkpoint save).
TEST_HOOKS = {"HASHREC_CHECKPOINT_TEST_PAUSE_FILE"}


def _text(*names: str) -> str:
    return "\n".join((ROOT / name).read_text() for name in names)


def _variables(text: str) -> set[str]:
    # Whole names only: `HASHREC_UPSERT_*` stands for a family and names none.
    return set(re.findall(r"HASHREC_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_*])", text))


def test_environment_variables_documented_are_those_read():
    read = set()
    for path in (ROOT / "hashrec").rglob("*.py"):
        read |= _variables(path.read_text())
    documented = _variables(_text(*DOCS))
    assert read - TEST_HOOKS - documented == set()
    assert documented - read == set()


def test_every_benchmark_script_is_listed():
    listing = (ROOT / "benchmarks/README.md").read_text()
    scripts = sorted(p.name for p in (ROOT / "benchmarks").iterdir()
                     if p.suffix in (".py", ".sh"))
    assert scripts
    assert [name for name in scripts if f"`{name}" not in listing] == []


@pytest.mark.parametrize("doc", DOCS)
def test_links_and_named_results_exist(doc):
    text = (ROOT / doc).read_text()
    base = (ROOT / doc).parent
    missing = [link for link in re.findall(r"\]\(([^)#\s]+)", text)
               if not (base / link).exists()]
    # Result files are named bare (`table_floor.md`); a name that starts with "_" is the
    # suffix of the one before it (`table_gpu.md` against `_at_8264d99.md`).
    results = ROOT / "benchmarks/results"
    for name in re.findall(r"`([A-Za-z0-9][\w.-]*\.(?:md|json|txt|log))`", text):
        if not any((where / name).exists() for where in (results, ROOT, base)):
            missing.append(name)
    assert missing == []


def test_eval_help_names_every_default_metric():
    from hashrec.eval import build_parser
    from hashrec.train.metrics import build_metrics

    text = " ".join(build_parser().format_help().split())
    defaults = {name for regression, num_class in ((False, 1), (False, 2), (False, 3),
                                                   (True, 1))
                for name in build_metrics([], regression=regression, num_class=num_class)}
    assert {"auc", "multiclass_auc", "mean_squared_error"} == defaults
    assert [name for name in sorted(defaults) if f" {name}" not in text] == []
