"""Look inside the sdist and the wheel that scripts/ci.py's `build` step built.

    python .ci/check_dist.py DIST_DIR      (in a virtualenv holding trove-classifiers)

The sdist must hold the package, docs, license, README and changelog but no tests
(MANIFEST.in prunes them); the wheel the package data and the testing kit's pytest11 entry
point; the metadata the SPDX license, the project URLs, no test/dev extras and only known
classifiers (twine does not check those; PyPI refuses an upload with an unknown one).
Prints both files' contents; exits 1 with the problems found.
"""

from __future__ import annotations

import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

from trove_classifiers import classifiers as known_classifiers

SDIST_MUST_HOLD = (
    "LICENSE",
    "README.md",
    "CHANGELOG.md",
    "pyproject.toml",
    "django_leasejobs/py.typed",
)
SDIST_MUST_NOT_SHIP = {"tests", "testproject", "bench", "scripts", ".ci"}
WHEEL_MUST_HOLD = (
    "django_leasejobs/py.typed",
    "django_leasejobs/migrations/0001_",
    "django_leasejobs/templates/",
    "django_leasejobs/static/",
    "django_leasejobs/management/commands/runworker.py",
)


def main(dist: Path) -> int:
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    with tarfile.open(sdist) as tar:
        sdist_files = sorted(m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile())
    with zipfile.ZipFile(wheel) as whl:
        wheel_files = set(whl.namelist())
        (metadata_name,) = (n for n in wheel_files if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(whl.read(metadata_name).decode())
        (entry_points_name,) = (n for n in wheel_files if n.endswith(".dist-info/entry_points.txt"))
        entry_points = whl.read(entry_points_name).decode()
    print(f"{sdist.name}: {len(sdist_files)} files")
    for name in sdist_files:
        print(f"  {name}")
    print(f"{wheel.name}: {len(wheel_files)} files")

    problems = []
    for name in SDIST_MUST_HOLD:
        if name not in sdist_files:
            problems.append(f"the sdist lacks {name}")
    shipped = sorted({n.split("/")[0] for n in sdist_files} & SDIST_MUST_NOT_SHIP)
    if shipped:
        problems.append(f"the sdist ships {', '.join(shipped)} (MANIFEST.in prunes them)")
    for prefix in WHEEL_MUST_HOLD:
        if not any(n.startswith(prefix) for n in wheel_files):
            problems.append(f"the wheel lacks {prefix}*")
    if any(n.split("/")[0] in {"tests", "testproject"} for n in wheel_files):
        problems.append("the wheel ships tests")
    if "[pytest11]" not in entry_points:
        problems.append("the wheel lacks the testing kit's pytest11 entry point")
    extras = set(metadata.get_all("Provides-Extra") or [])
    urls = metadata.get_all("Project-URL") or []
    if metadata["License-Expression"] != "BSD-3-Clause" or not urls or extras & {"test", "dev"}:
        problems.append(
            f"metadata: License-Expression {metadata['License-Expression']!r}, "
            f"{len(urls)} project URLs, extras {sorted(extras)}"
        )
    for classifier in metadata.get_all("Classifier") or []:
        if classifier not in known_classifiers:
            problems.append(f"unknown classifier {classifier!r} (trove-classifiers)")
    print(
        f"version {metadata['Version']}, extras {sorted(extras)}, "
        f"{len(metadata.get_all('Classifier') or [])} classifiers"
    )
    for problem in problems:
        print(f"!! {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
