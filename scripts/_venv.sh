# shellcheck shell=bash
# Sourced by scripts/test, scripts/demo, scripts/bench and scripts/ci.py: create or reuse the
# virtualenv and install the project into it (editable) plus one PEP 735 dependency group of
# pyproject.toml:
#
#   leasejobs_ensure_venv GROUP     GROUP: demo, test, dev or bench
#
#   VENV       virtualenv directory (default: .venv, relative to the repository root)
#   PYTHON     interpreter that creates it (default: python3)
#   EXTRA_PIP  extra requirement specs for the same pip run, e.g. 'django>=5.2,<6 django-tasks'
#
# Sets VENV to an absolute path and VENV_PYTHON to the virtualenv's python.
#
# pip reads dependency groups from 25.1 on (`pip install --group`): an older pip in the
# virtualenv is upgraded first. A second call with nothing changed runs no pip at all: after
# a successful install, the stamp file $VENV/.leasejobs-install.json records what it
# installed (a hash of pyproject.toml, EXTRA_PIP, the Python version, the repository it
# points at, the package version, and the groups installed under those, with the groups they include: after
# `dev`, `test` needs nothing). When they still match, the group's distributions are all
# present and the package imports from this checkout, pip is skipped; a changed
# pyproject.toml (or version, EXTRA_PIP, or interpreter) installs again. An EXTRA_PIP naming a
# local path or a branch is not looked into: remove the stamp to install its changes.

# The stamp's reader and writer: python -I -c "$_LEASEJOBS_STAMP_PY" check|write REPO GROUP STAMP.
# Runs with -I (isolated: the current directory is not on sys.path), so the import check
# sees the installed package, never a checkout that merely happens to be the cwd.
_LEASEJOBS_STAMP_PY='
import hashlib, json, os, re, sys
from importlib import metadata

mode, repo_root, group, stamp_path = sys.argv[1:5]
with open(os.path.join(repo_root, "pyproject.toml"), "rb") as f:
    raw = f.read()
# The version is read from the package (pyproject.toml: dynamic): a bump must reinstall, or
# the editable install keeps the old version in its metadata.
with open(os.path.join(repo_root, "django_leasejobs", "__init__.py"), "rb") as f:
    version = re.search(rb"^__version__ = [\x27\x22]([^\x27\x22]+)", f.read(), re.M)
key = {
    "pyproject_sha256": hashlib.sha256(raw).hexdigest(),
    "version": version.group(1).decode() if version else "",
    "extra_pip": os.environ.get("EXTRA_PIP", ""),
    "python": sys.version,
    "repo": repo_root,
}
# write: the stamp of the install before this one was moved aside to STAMP.prev (its groups
# stay installed when the key is the same).
read_path = stamp_path + ".prev" if mode == "write" else stamp_path
try:
    with open(read_path) as f:
        stamp = json.load(f)
except (OSError, ValueError):
    stamp = {}
same_key = stamp.get("key") == key

if mode == "write":
    import tomllib

    # The groups this one includes are installed with it (dev holds test).
    table = tomllib.loads(raw.decode())["dependency-groups"]
    done, todo = set(), [group]
    while todo:
        name = todo.pop()
        if name not in done:
            done.add(name)
            todo += [i["include-group"] for i in table[name] if isinstance(i, dict)]
    groups = sorted(set(stamp.get("groups", []) if same_key else []) | done)
    with open(stamp_path + ".tmp", "w") as f:
        json.dump({"key": key, "groups": groups}, f, indent=1)
    os.replace(stamp_path + ".tmp", stamp_path)
    if os.path.exists(read_path):
        os.remove(read_path)
    sys.exit(0)

# check: exit 0 when nothing needs installing, else print why and exit 1.
if not same_key or group not in stamp.get("groups", []):
    print("no install of this pyproject.toml, group, EXTRA_PIP and Python recorded")
    sys.exit(1)
import tomllib

groups = tomllib.loads(raw.decode())["dependency-groups"]
try:
    from pip._vendor.packaging.requirements import Requirement
except ImportError:
    Requirement = None


def names(name, seen=()):
    for item in groups[name]:
        if isinstance(item, dict):
            if item["include-group"] not in seen:
                yield from names(item["include-group"], (*seen, name))
        elif Requirement is not None:
            req = Requirement(item)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                yield req.name
        else:
            yield re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", item).group(0)


for name in names(group):
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        print(f"{name} (group {group}) is not installed")
        sys.exit(1)
try:
    import django_leasejobs
except Exception as exc:
    print(f"django_leasejobs does not import: {type(exc).__name__}: {exc}")
    sys.exit(1)
where = os.path.dirname(os.path.dirname(os.path.abspath(django_leasejobs.__file__)))
if os.path.realpath(where) != os.path.realpath(repo_root):
    print(f"django_leasejobs imports from {where}, not from {repo_root}")
    sys.exit(1)
'

leasejobs_ensure_venv() {
    local group="${1:-}" want have
    local repo_root
    repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    if [ -z "$group" ]; then
        echo "error: leasejobs_ensure_venv GROUP (a dependency group of pyproject.toml: demo, test, dev, bench)" >&2
        return 1
    fi
    PYTHON="${PYTHON:-python3}"
    VENV="${VENV:-.venv}"
    case "$VENV" in
        /*) ;;
        *) VENV="$repo_root/$VENV" ;;
    esac

    if ! want="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"; then
        echo "error: cannot run the interpreter PYTHON=$PYTHON" >&2
        return 1
    fi
    if [ -e "$VENV" ]; then
        have="$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo none)"
        if [ "$have" != "$want" ]; then
            if [ ! -f "$VENV/pyvenv.cfg" ]; then
                echo "error: $VENV exists and is not a virtualenv; set VENV to another directory" >&2
                return 1
            fi
            echo "==> $VENV has Python $have, $PYTHON is $want: recreating it" >&2
            rm -rf "$VENV"
        fi
    fi
    if [ ! -e "$VENV" ]; then
        echo "==> creating virtualenv $VENV with $PYTHON (Python $want)" >&2
        "$PYTHON" -m venv "$VENV"
    fi
    VENV_PYTHON="$VENV/bin/python"

    local stamp="$VENV/.leasejobs-install.json" why
    if why="$("$VENV_PYTHON" -I -c "$_LEASEJOBS_STAMP_PY" check "$repo_root" "$group" "$stamp" 2>&1)"; then
        echo "==> $VENV is up to date (django-leasejobs + group $group${EXTRA_PIP:+ + $EXTRA_PIP}): no pip run" >&2
        return 0
    fi

    export PIP_DISABLE_PIP_VERSION_CHECK=1
    if ! "$VENV_PYTHON" -I -c 'import sys
from importlib.metadata import version
sys.exit(tuple(int(p) for p in version("pip").split(".")[:2]) < (25, 1))' 2>/dev/null; then
        echo "==> upgrading pip in $VENV (dependency groups need pip >= 25.1)" >&2
        "$VENV_PYTHON" -m pip install --quiet --upgrade "pip>=25.1" || return 1
    fi

    local -a extra_specs=()
    if [ -n "${EXTRA_PIP:-}" ]; then
        read -r -a extra_specs <<<"$EXTRA_PIP"
    fi
    echo "==> installing django-leasejobs (editable) + group $group${EXTRA_PIP:+ + $EXTRA_PIP} into $VENV (${why##*$'\n'})" >&2
    if [ -e "$stamp" ]; then
        mv -f "$stamp" "$stamp.prev"
    fi
    if ! "$VENV_PYTHON" -m pip install --quiet -e "$repo_root" --group "$repo_root/pyproject.toml:$group" \
        ${extra_specs[@]+"${extra_specs[@]}"}; then
        rm -f "$stamp.prev"
        return 1
    fi
    "$VENV_PYTHON" -I -c "$_LEASEJOBS_STAMP_PY" write "$repo_root" "$group" "$stamp"
}
