"""PostgreSQL ``LISTEN leasejobs``: wake an idle worker the moment a job is enqueued.

The backend sends ``pg_notify('leasejobs', <queue>)`` in the enqueueing transaction,
so the notification arrives on commit (the reaper and a worker giving jobs back send
one too). While ``LISTEN`` is active the worker's ``listening`` is true and an idle
worker polls only every ``IDLE_POLL_INTERVAL`` and when its queues' next delayed job
comes due; otherwise (pooled, connection lost, not PostgreSQL) it polls every
``POLL_INTERVAL``. A lost listener connection is re-opened with backoff. The
connection gets the worker's TCP hardening (``Worker._harden_connections`` sets it
on ``LISTEN_DATABASE``'s settings as on ``DATABASE``'s).

``LISTEN`` belongs to a server session. Behind a pooler in transaction mode
(PgBouncer) it would land on a server connection that other clients' transactions
then use, and the notifications would go to them. So the listener connects to
``OPTIONS["LISTEN_DATABASE"]`` when it is set (trusted: the site says it connects
directly), and otherwise first makes sure the connection to ``DATABASE`` is direct:

* ``DISABLE_SERVER_SIDE_CURSORS = True`` on the alias is Django's documented setting
  for transaction pooling: pooled, no connection needed to tell;
* else one query (no ``NOTIFY``: a probe notification could itself reach another
  client) asks the server which client socket its session serves, and compares it
  with this connection's own socket: over TCP the client address and port, and the
  server port (``inet_client_addr()``, ``inet_client_port()``, ``inet_server_port()``
  against ``getsockname()`` / ``getpeername()``); over a Unix socket the socket file
  we connected to against the server's ``unix_socket_directories`` and ``port``
  (the port alone for a role that may not read the directories). A pooler or proxy
  in between has sockets of its own, so they differ.

A pooled connection is closed without ``LISTEN``; the worker says so once at WARNING
with the fix and finds jobs by polling.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import select
import socket
import threading
from typing import TYPE_CHECKING, Any

from django.db import connections

from ..leases import NOTIFY_CHANNEL
from .announcer import Announcer
from .inbox import JobsMayBeReady, Listening
from .threads import ThreadContext, WorkerThread

if TYPE_CHECKING:
    import psycopg


_SESSION_SOCKET_SQL = (
    "SELECT host(inet_client_addr()), inet_client_port(), inet_server_port(), "
    "current_setting('port'), "
    # NULL (no row) for a role that may not read it (superuser or pg_read_all_settings).
    "(SELECT setting FROM pg_settings WHERE name = 'unix_socket_directories')"
)


def listen_connection_params(alias: str) -> dict[str, Any]:
    params = dict(connections[alias].get_connection_params())
    for django_only in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(django_only, None)
    return params


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    address = ipaddress.ip_address(host.split("%", 1)[0])  # (an IPv6 scope: "fe80::1%eth0")
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _unix_path(address: str | bytes) -> str:
    """A Unix socket address as PostgreSQL spells it (abstract ones start with ``@``)."""
    if isinstance(address, bytes):
        text = address.decode(errors="replace")
        return "@" + text[1:] if text.startswith("\0") else text
    return address


def _socket_directories(setting: str) -> list[str]:
    return [d.strip().strip('"') for d in setting.split(",") if d.strip()]


def pooler_in_between(conn: psycopg.Connection[Any]) -> str:
    """Why ``conn``'s server session does not serve ``conn``'s own socket ('' when it does).

    Something that is not our socket on the server's side means a pooler or a proxy
    connects there for us, and a ``LISTEN`` could outlive our use of its connection.
    """
    [(client_host, client_port, server_port, port, directories)] = conn.execute(
        _SESSION_SOCKET_SQL
    ).fetchall()
    with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
        family = sock.family
        local = sock.getsockname()
        peer = sock.getpeername()
    if family == socket.AF_UNIX:
        path = _unix_path(peer)
        if client_host is not None:
            return (
                f"this connection is the Unix socket {path}, but the server serves a TCP "
                f"client at {client_host}:{client_port}"
            )
        if directories is None:
            wanted = [f".s.PGSQL.{port}"]
            if path.rsplit("/", 1)[-1] in wanted:
                return ""
        else:
            wanted = [f"{d}/.s.PGSQL.{port}" for d in _socket_directories(directories)]
            if path in wanted:
                return ""
        return (
            f"this connection is the Unix socket {path}, but the server listens on "
            f"{' or '.join(wanted)}"
        )
    ours = f"{local[0]}:{local[1]} -> port {peer[1]}"
    if client_host is None:
        return f"this connection is TCP ({ours}), but the server serves a Unix-socket client"
    if (_ip(local[0]), local[1], peer[1]) != (_ip(client_host), client_port, server_port):
        return (
            f"this connection is {ours}, but the server serves "
            f"{client_host}:{client_port} -> port {server_port}"
        )
    return ""


NOTIFY_WAIT = 5.0
"""Longest wait for a notification before the listener looks at its stop event again;
a stop wakes it at once (:meth:`Listener.wake`)."""


class Listener(WorkerThread):
    def __init__(self, ctx: ThreadContext, stop: threading.Event) -> None:
        super().__init__(ctx, stop, "listener")
        # A stop sends a byte here: the wait for notifications watches this socket and
        # the connection's together, so a stopping worker does not wait out a timeout
        # to join this thread.
        self._waker, self._wake_sender = socket.socketpair()
        self._wake_sender.setblocking(False)
        configured = ctx.options.listen_database
        self.trusted = configured is not None
        """``LISTEN_DATABASE`` is set: its connection is taken as direct, unexamined."""
        self.alias = configured if configured is not None else ctx.database
        self.announcer = Announcer(ctx.worker_id, ctx.backend)

    def _poll_instead(self, why: str) -> None:
        self.announcer.pooled(self.alias, why, self.ctx.options.poll_interval)

    def loop(self) -> None:
        import psycopg

        if not self.trusted and connections[self.alias].settings_dict.get(
            "DISABLE_SERVER_SIDE_CURSORS"
        ):
            self._poll_instead("its DISABLE_SERVER_SIDE_CURSORS is set")
            return
        failures = 0
        while not self.stop_event.is_set():
            try:
                with psycopg.connect(
                    **listen_connection_params(self.alias), autocommit=True
                ) as conn:
                    why = "" if self.trusted else pooler_in_between(conn)
                    if why:
                        self._poll_instead(why)
                        return
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    failures = 0
                    self.announcer.listening(self.alias)
                    try:
                        # From now on NOTIFY wakes the worker: idle, it polls only every
                        # IDLE_POLL_INTERVAL and when its next delayed job comes due.
                        # (and a claim now: jobs may have come while not listening)
                        self.ctx.inbox.post(Listening(True))
                        self._relay(conn)
                    finally:
                        # Back to polling every POLL_INTERVAL at once (a claim now, too:
                        # jobs may be enqueued while nothing listens).
                        self.ctx.inbox.post(Listening(False))
            except psycopg.Error as exc:
                failures += 1
                self.announcer.listen_failed(str(exc))
                self.stop_event.wait(min(10.0, 0.5 * 2**failures))

    def _relay(self, conn: psycopg.Connection[Any]) -> None:
        """Post a ``JobsMayBeReady`` for each notification of one of this worker's
        queues, until the stop event is set."""
        queues = self.ctx.queues
        watched = [conn.fileno(), self._waker.fileno()]
        while not self.stop_event.is_set():
            # timeout=0: what has arrived, also while a query ran on this connection
            # (psycopg keeps those aside: they never make the socket readable again).
            for notify in conn.notifies(timeout=0):
                if queues is None or notify.payload in queues:
                    self.ctx.inbox.post(JobsMayBeReady())
            readable, _, _ = select.select(watched, [], [], NOTIFY_WAIT)
            if self._waker.fileno() in readable:
                return

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # a byte is there already, or it is closed
            self._wake_sender.send(b"x")
