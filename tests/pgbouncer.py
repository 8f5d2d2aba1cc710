"""A PgBouncer of the test run's own, in transaction mode, in front of the test database.

``running(binary, settings_dict)`` writes a configuration into a temporary directory
(``[databases] * = host=... port=...`` pointing at the server of ``settings_dict``,
which may be a TCP address or the embedded server's Unix socket directory), starts
``pgbouncer`` on a free loopback port, waits until it accepts connections, yields the
handle, and stops it and removes the directory at the end. Debian's ``pgbouncer``
package provides the binary (.ci/run installs it when missing; the package's own
service is never used).

PgBouncer refuses to run as root: as root it is started with ``-u USER`` and the
directory is handed to that user: the owner of the server's Unix socket directory
(the embedded server keeps its socket in its private data directory), or ``nobody``
for a server on TCP.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.waiting import wait_until

STRAY_NOTIFICATION = "got packet 'A' from server when not linked"
"""PgBouncer's line for a notification that arrived on a server connection no client
was using: a ``LISTEN`` was left behind on a pooled connection."""

RUN_AS_WHEN_ROOT = "nobody"
"""(Unless the server is on a Unix socket: then the owner of its directory.)"""


def find_pgbouncer() -> str | None:
    """The ``pgbouncer`` binary (Debian puts it in /usr/sbin, often not on PATH)."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    candidate = "/usr/sbin/pgbouncer"
    return candidate if os.access(candidate, os.X_OK) else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PgBouncer:
    process: subprocess.Popen[bytes]
    port: int
    directory: Path

    @property
    def log_path(self) -> Path:
        return self.directory / "pgbouncer.log"

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stray_notifications(self) -> list[str]:
        return [line for line in self.log().splitlines() if STRAY_NOTIFICATION in line]

    def settings_dict(self, direct: Mapping[str, Any]) -> dict[str, Any]:
        """``direct`` (a DATABASES entry of the test database) through this pooler."""
        return {**direct, "HOST": "127.0.0.1", "PORT": str(self.port)}

    @classmethod
    def start(
        cls, binary: str, direct: Mapping[str, Any], directory: Path, pool_size: int = 20
    ) -> PgBouncer:
        user = str(direct.get("USER") or os.environ.get("USER") or "postgres")
        host = str(direct.get("HOST") or "/var/run/postgresql")
        server_port = str(direct.get("PORT") or 5432)
        port = _free_port()
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "users.txt").write_text(f'"{user}" ""\n')
        (directory / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={host} port={server_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {directory / 'users.txt'}\n"
            "pool_mode = transaction\n"
            "max_client_conn = 500\n"
            f"default_pool_size = {pool_size}\n"
            "ignore_startup_parameters = extra_float_digits, options\n"
            f"logfile = {directory / 'pgbouncer.log'}\n"
            "log_connections = 0\n"
            "log_disconnections = 0\n"
        )
        argv = [binary]
        if os.geteuid() == 0:
            run_as = RUN_AS_WHEN_ROOT
            if host.startswith("/"):
                run_as = pwd.getpwuid(os.stat(host).st_uid).pw_name
            shutil.chown(directory, run_as)
            for path in directory.iterdir():
                shutil.chown(path, run_as)
            argv += ["-u", run_as]
        argv.append(str(directory / "pgbouncer.ini"))
        process = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        bouncer = cls(process, port, directory)

        def listening() -> bool:
            if process.poll() is not None:
                stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
                raise RuntimeError(
                    f"pgbouncer exited ({process.returncode}):\n{stderr}\n{bouncer.log()}"
                )
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                return True
            return False

        try:
            wait_until(listening, 20, what=f"pgbouncer to listen on {port}")
        except AssertionError:
            bouncer.stop()
            raise RuntimeError(
                f"pgbouncer did not listen on {port} in 20 s:\n{bouncer.log()}"
            ) from None
        return bouncer

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # PgBouncer's immediate shutdown
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.process.stderr is not None:
            self.process.stderr.close()


@contextlib.contextmanager
def running(binary: str, direct: Mapping[str, Any], pool_size: int = 20) -> Iterator[PgBouncer]:
    """A PgBouncer in front of the database of ``direct`` for the duration of the block.

    (Its directory is made in the system's temporary directory, which every user can
    reach: as root the pooler runs as another user.)
    """
    directory = Path(tempfile.mkdtemp(prefix="leasejobs-pgbouncer-"))
    try:
        bouncer = PgBouncer.start(binary, direct, directory, pool_size)
        try:
            yield bouncer
        finally:
            bouncer.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
