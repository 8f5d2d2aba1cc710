"""The bench scripts as the tests use them: loaded by path for their pure parts
(``load_bench``), or run end to end at a tiny size in a subprocess (``run_bench``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from tests.conftest import REPO_ROOT

BENCH_DIR = REPO_ROOT / "bench"


def load_bench(name: str) -> ModuleType:
    """``bench/<name>.py`` as the module ``bench_<name>``, with bench/ on ``sys.path``
    (last) as when the script runs: its functions import their siblings by name, such as
    ``build_parser`` ``pgserver`` (``add_server_options``)."""
    if str(BENCH_DIR) not in sys.path:
        sys.path.append(str(BENCH_DIR))
    return load_file(BENCH_DIR / f"{name}.py", f"bench_{name}")


def load_file(path: Path, module_name: str) -> ModuleType:
    """The Python file ``path`` as the module ``module_name`` (registered in
    ``sys.modules``: dataclasses look their module up while decorating)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_bench(
    name: str, args: Sequence[str], env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run ``bench/<name>.py`` with ``args`` from the repository's root and assert that it
    exited 0 (the failure shows its whole output)."""
    result = subprocess.run(
        [sys.executable, str(BENCH_DIR / f"{name}.py"), *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result
