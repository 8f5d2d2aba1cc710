# shellcheck shell=bash
# Sourced by scripts/test and scripts/demo: create or reuse the virtualenv and install
# the project into it (editable).
#
#   VENV       virtualenv directory (default: .venv, relative to the repository root)
#   PYTHON     interpreter that creates it (default: python3)
#   EXTRA_PIP  extra requirement specs for the same pip run, e.g. 'django>=5.2,<6 django-tasks'
#
# Sets VENV to an absolute path and VENV_PYTHON to the virtualenv's python.

leasejobs_ensure_venv() {
    local extras="$1" want have
    local repo_root
    repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
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

    local -a extra_specs=()
    if [ -n "${EXTRA_PIP:-}" ]; then
        read -r -a extra_specs <<<"$EXTRA_PIP"
    fi
    echo "==> installing django-leasejobs[$extras]${EXTRA_PIP:+ $EXTRA_PIP} into $VENV" >&2
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV_PYTHON" -m pip install --quiet \
        -e "${repo_root}[${extras}]" ${extra_specs[@]+"${extra_specs[@]}"}
}
