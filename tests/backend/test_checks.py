"""System checks of TASKS[...]["OPTIONS"]: each id fires on its bad setting; defaults are silent."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import django
import pytest
from django.conf import settings
from django.core import checks
from django.core.checks import run_checks
from django.db import connections
from django.test import override_settings

from django_leasejobs import checks as leasejobs_checks
from django_leasejobs.compat import USING_BACKPORT
from django_leasejobs.conf import (
    E_APP_NOT_INSTALLED,
    E_BAD_VALUE,
    E_DATABASE_FEATURES,
    E_DURATION_TOO_LONG,
    E_HEARTBEAT_NOT_BELOW_LEASE,
    E_LOCK_LOST_BEHAVIOR,
    E_UNKNOWN_DATABASE,
    E_UNKNOWN_OPTION,
    LOCK_LOST_ENV_VAR,
    MAX_SECONDS,
    W_FOREIGN_DATABASE_OPTION,
    W_HEARTBEAT_TOO_FAST,
    W_HEARTBEAT_TOO_SLOW,
    W_LEASE_TOO_SHORT,
    W_POLL_TOO_FAST,
    parse_options,
)

BACKEND = "django_leasejobs.backend.LeaseJobsBackend"
ALL_IDS = {
    E_UNKNOWN_OPTION,
    E_BAD_VALUE,
    E_LOCK_LOST_BEHAVIOR,
    E_HEARTBEAT_NOT_BELOW_LEASE,
    E_UNKNOWN_DATABASE,
    E_DATABASE_FEATURES,
    E_DURATION_TOO_LONG,
    E_APP_NOT_INSTALLED,
    W_HEARTBEAT_TOO_SLOW,
    W_LEASE_TOO_SHORT,
    W_POLL_TOO_FAST,
    W_HEARTBEAT_TOO_FAST,
}


def tasks_setting(options: Any, **extra: Any) -> dict[str, Any]:
    """TASKS with one LeaseJobs backend ("default") using ``options``."""
    return {
        "default": {
            "BACKEND": BACKEND,
            "QUEUES": ["default", "high", "low"],
            "OPTIONS": options,
            **extra,
        }
    }


def leasejobs_messages(
    options: Any, databases: list[str] | None = None
) -> list[checks.CheckMessage]:
    with override_settings(TASKS=tasks_setting(options)):
        messages = run_checks(databases=databases)
    return [m for m in messages if str(m.id).startswith("leasejobs.")]


def ids(messages: list[checks.CheckMessage]) -> list[str]:
    return [str(m.id) for m in messages]


@pytest.fixture(autouse=True)
def _no_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    # The environment variable overrides the option: keep it out unless a test sets it.
    monkeypatch.delenv(LOCK_LOST_ENV_VAR, raising=False)


# --------------------------------------------------------------------------- silence


def test_ids_are_stable() -> None:
    expected = {f"leasejobs.E00{n}" for n in range(1, 9)} | {
        f"leasejobs.W00{n}" for n in range(1, 5)
    }
    assert expected == ALL_IDS
    assert (E_DURATION_TOO_LONG, W_LEASE_TOO_SHORT, W_POLL_TOO_FAST, W_HEARTBEAT_TOO_FAST) == (
        "leasejobs.E007",
        "leasejobs.W002",
        "leasejobs.W003",
        "leasejobs.W004",
    )


def test_silent_on_the_test_settings() -> None:
    assert [m for m in run_checks() if str(m.id).startswith("leasejobs.")] == []


def test_silent_on_defaults() -> None:
    assert leasejobs_messages({}) == []


def test_async_defaults() -> None:
    """An event loop runs up to 100 async jobs at once, and a step may hold it 10 s
    (docs/configuration.md)."""
    config, problems = parse_options({}, environ={})
    assert problems == []
    assert (config.async_concurrency, config.async_blocking_limit) == (100, 10.0)


def test_silent_on_every_option_set_to_a_valid_value() -> None:
    options = {
        "LEASE_DURATION": 60,
        "HEARTBEAT_INTERVAL": 20,
        "STALE_LOCK_INTERVAL": 0,
        "STALE_LOCK_AGE": 5.5,
        "MAX_ATTEMPTS": 1,
        "MAX_STALLS": 10,
        "RETRY_BACKOFF": {"base": 1, "factor": 3, "cap": 60, "jitter": 0},
        "LOCK_LOST_BEHAVIOR": "sigterm",
        "LOCK_LOST_GRACE": 0,
        "ASYNC_CONCURRENCY": 500,
        "ASYNC_BLOCKING_LIMIT": 2.5,
        "POLL_INTERVAL": 0.5,
        "DATABASE": "default",
        "IMPORTS": ["tests.tasks"],
    }
    assert leasejobs_messages(options) == []
    config, problems = parse_options(options, environ={})
    assert problems == []
    assert config.lease_duration == 60.0
    assert config.heartbeat_interval == 20.0
    assert config.max_attempts == 1
    assert config.lock_lost_behavior == "sigterm"
    assert (config.async_concurrency, config.async_blocking_limit) == (500, 2.5)
    assert config.imports == ("tests.tasks",)


@pytest.mark.django_db
def test_silent_on_defaults_with_database_checks() -> None:
    assert leasejobs_messages({}, databases=["default"]) == []
    # And the whole check run of the test project has no error at all.
    with override_settings(TASKS=tasks_setting({})):
        errors = [m for m in run_checks(databases=["default"]) if m.is_serious()]
    assert errors == []


def test_other_backends_are_ignored() -> None:
    package = "django_tasks" if USING_BACKPORT else "django.tasks"
    dummy = f"{package}.backends.dummy.DummyBackend"
    with override_settings(
        TASKS={
            **tasks_setting({}),
            "other": {"BACKEND": dummy, "OPTIONS": {"LEASE_DURATION": "not ours"}},
        }
    ):
        assert [alias for alias, _ in leasejobs_checks.leasejobs_backends()] == ["default"]


# --------------------------------------------------------------------------- E001


def test_e001_unknown_option() -> None:
    messages = leasejobs_messages({"LEASE_DURATON": 30})
    assert ids(messages) == [E_UNKNOWN_OPTION]
    message = messages[0]
    assert message.level == checks.ERROR
    assert "LEASE_DURATON" in message.msg
    assert "LEASE_DURATION" in message.hint  # the hint lists the known options
    assert message.obj == "TASKS['default']"


# --------------------------------------------------------------------------- E002


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"LEASE_DURATION": "30"}, "LEASE_DURATION"),
        ({"LEASE_DURATION": -1}, "LEASE_DURATION"),
        ({"LEASE_DURATION": 0}, "LEASE_DURATION"),
        ({"LEASE_DURATION": True}, "LEASE_DURATION"),
        ({"MAX_ATTEMPTS": 0}, "MAX_ATTEMPTS"),
        ({"MAX_ATTEMPTS": 1.5}, "MAX_ATTEMPTS"),
        ({"MAX_STALLS": "3"}, "MAX_STALLS"),
        ({"STALE_LOCK_AGE": -0.1}, "STALE_LOCK_AGE"),
        ({"POLL_INTERVAL": 0}, "POLL_INTERVAL"),
        ({"RETRY_BACKOFF": "fast"}, "RETRY_BACKOFF"),
        ({"RETRY_BACKOFF": {"bogus": 1}}, "RETRY_BACKOFF"),
        ({"RETRY_BACKOFF": {"jitter": 1.5}}, "jitter"),
        ({"RETRY_BACKOFF": {"factor": 0.5}}, "factor"),
        ({"DATABASE": 1}, "DATABASE"),
        ({"DATABASE": ""}, "DATABASE"),
        ({"IMPORTS": "tests.tasks"}, "IMPORTS"),
        ({"ASYNC_CONCURRENCY": 0}, "ASYNC_CONCURRENCY"),
        ({"ASYNC_CONCURRENCY": 2.5}, "ASYNC_CONCURRENCY"),
        ({"ASYNC_BLOCKING_LIMIT": 0}, "ASYNC_BLOCKING_LIMIT"),
        ({"ASYNC_BLOCKING_LIMIT": "5"}, "ASYNC_BLOCKING_LIMIT"),
    ],
)
def test_e002_bad_value(options: dict[str, Any], needle: str) -> None:
    messages = leasejobs_messages(options)
    assert ids(messages) == [E_BAD_VALUE], messages
    assert needle in messages[0].msg
    assert messages[0].level == checks.ERROR


@pytest.mark.parametrize("options", [[], None], ids=["list", "none"])
def test_e002_options_not_a_dict(options: Any) -> None:
    messages = leasejobs_messages(options)
    assert ids(messages) == [E_BAD_VALUE]
    assert "OPTIONS must be a dict" in messages[0].msg


@pytest.mark.parametrize("options", ["abc", 5, ["LEASE_DURATION"]], ids=["str", "int", "list"])
def test_e002_options_not_a_dict_does_not_crash_the_check_run(options: Any) -> None:
    messages = leasejobs_messages(options)
    assert ids(messages) == [E_BAD_VALUE]


@pytest.mark.parametrize(
    "options",
    [
        {"LEASE_DURATION": float("nan")},
        {"LEASE_DURATION": float("inf")},
        {"HEARTBEAT_INTERVAL": float("nan")},
        {"RETRY_BACKOFF": {"base": float("nan")}},
    ],
    ids=["lease-nan", "lease-inf", "heartbeat-nan", "backoff-base-nan"],
)
def test_e002_non_finite_numbers(options: dict[str, Any]) -> None:
    assert E_BAD_VALUE in ids(leasejobs_messages(options))


def test_several_problems_are_all_reported() -> None:
    messages = leasejobs_messages({"NOPE": 1, "MAX_ATTEMPTS": 0, "LOCK_LOST_BEHAVIOR": "x"})
    assert sorted(ids(messages)) == sorted([E_UNKNOWN_OPTION, E_BAD_VALUE, E_LOCK_LOST_BEHAVIOR])


# --------------------------------------------------------------------------- E003


def test_e003_unknown_lock_lost_behavior_option() -> None:
    messages = leasejobs_messages({"LOCK_LOST_BEHAVIOR": "sighup"})
    assert ids(messages) == [E_LOCK_LOST_BEHAVIOR]
    assert "sighup" in messages[0].msg
    assert "LOCK_LOST_BEHAVIOR option" in messages[0].msg


def test_e003_unknown_lock_lost_behavior_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LOCK_LOST_ENV_VAR, "sigstop")
    messages = leasejobs_messages({})
    assert ids(messages) == [E_LOCK_LOST_BEHAVIOR]
    assert "sigstop" in messages[0].msg
    assert LOCK_LOST_ENV_VAR in messages[0].msg


def test_env_var_overrides_a_valid_option() -> None:
    config, problems = parse_options(
        {"LOCK_LOST_BEHAVIOR": "sigkill"}, environ={LOCK_LOST_ENV_VAR: "sigterm"}
    )
    assert problems == []
    assert config.lock_lost_behavior == "sigterm"


def test_env_var_is_normalised_and_overrides_the_process_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(LOCK_LOST_ENV_VAR, " SIGTERM ")
    config, problems = parse_options({"LOCK_LOST_BEHAVIOR": "sigkill"})
    assert (config.lock_lost_behavior, problems) == ("sigterm", [])
    # An empty variable is "unset": the option applies.
    config, problems = parse_options(
        {"LOCK_LOST_BEHAVIOR": "sigterm"}, environ={LOCK_LOST_ENV_VAR: ""}
    )
    assert (config.lock_lost_behavior, problems) == ("sigterm", [])
    # Without either, the default.
    assert parse_options({}, environ={})[0].lock_lost_behavior == "sigkill"


# --------------------------------------------------------------------------- E004 / W001


def test_e004_heartbeat_not_below_lease() -> None:
    messages = leasejobs_messages({"LEASE_DURATION": 30, "HEARTBEAT_INTERVAL": 30})
    assert ids(messages) == [E_HEARTBEAT_NOT_BELOW_LEASE]
    assert messages[0].level == checks.ERROR
    messages = leasejobs_messages({"LEASE_DURATION": 5})  # default heartbeat 10 s
    assert ids(messages) == [E_HEARTBEAT_NOT_BELOW_LEASE]


def test_w001_heartbeat_above_a_third_of_the_lease() -> None:
    messages = leasejobs_messages({"LEASE_DURATION": 30, "HEARTBEAT_INTERVAL": 15})
    assert ids(messages) == [W_HEARTBEAT_TOO_SLOW]
    assert messages[0].level == checks.WARNING
    assert "15s" in messages[0].msg
    assert "30s" in messages[0].msg
    # Exactly a third is fine.
    assert leasejobs_messages({"LEASE_DURATION": 30, "HEARTBEAT_INTERVAL": 10}) == []


def test_e004_falls_back_to_a_third_of_the_lease() -> None:
    config, problems = parse_options({"LEASE_DURATION": 6, "HEARTBEAT_INTERVAL": 9}, environ={})
    assert [p.id for p in problems] == [E_HEARTBEAT_NOT_BELOW_LEASE]
    assert "9s" in problems[0].msg
    assert "6s" in problems[0].msg
    assert config.heartbeat_interval == 2.0


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"LEASE_DURATION": "30", "HEARTBEAT_INTERVAL": 40}, [E_BAD_VALUE]),
        ({"LEASE_DURATION": 30, "HEARTBEAT_INTERVAL": -1}, [E_BAD_VALUE]),
        ({"LEASE_DURATION": 3e6, "HEARTBEAT_INTERVAL": 1e6}, [E_DURATION_TOO_LONG]),
        ({"LEASE_DURATION": 20, "HEARTBEAT_INTERVAL": 3e6}, [E_DURATION_TOO_LONG]),
    ],
    ids=["lease-bad", "heartbeat-bad", "lease-too-long", "heartbeat-too-long"],
)
def test_heartbeat_is_not_compared_with_a_rejected_value(
    options: dict[str, Any], expected: list[str]
) -> None:
    # The rejected value is replaced by its default: comparing with that would mislead.
    assert ids(leasejobs_messages(options)) == expected


# --------------------------------------------------------------------------- E007


def test_e007_lease_too_long_for_tcp_user_timeout() -> None:
    messages = leasejobs_messages({"LEASE_DURATION": 2_147_483.648})
    assert ids(messages) == [E_DURATION_TOO_LONG]
    assert messages[0].level == checks.ERROR
    assert "LEASE_DURATION" in messages[0].msg
    assert "2,147,483.647 s" in messages[0].msg
    assert "tcp_user_timeout" in messages[0].msg
    assert "2,147,483.647" in messages[0].hint
    # The bound itself is accepted, and the worker's tcp_user_timeout still fits an int.
    config, problems = parse_options({"LEASE_DURATION": MAX_SECONDS}, environ={})
    assert problems == []
    assert int(config.lease_duration * 1000) == 2**31 - 1


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("POLL_INTERVAL", "poll(2)"),
        ("STALE_LOCK_INTERVAL", "millisecond timeouts"),
        ("STALE_LOCK_AGE", "millisecond timeouts"),
        ("LOCK_LOST_GRACE", "millisecond timeouts"),
    ],
)
def test_e007_every_duration_has_the_same_bound(name: str, needle: str) -> None:
    messages = leasejobs_messages({name: 1e300})
    assert ids(messages) == [E_DURATION_TOO_LONG]
    assert name in messages[0].msg
    assert needle in messages[0].msg
    assert leasejobs_messages({name: MAX_SECONDS}) == []


def test_e007_does_not_apply_to_counts() -> None:
    assert leasejobs_messages({"MAX_ATTEMPTS": 10**12, "MAX_STALLS": 10**12}) == []


# --------------------------------------------------------------------------- W002 / W003 / W004


def test_w002_sub_second_lease() -> None:
    messages = leasejobs_messages({"LEASE_DURATION": 0.9, "HEARTBEAT_INTERVAL": 0.3})
    assert ids(messages) == [W_LEASE_TOO_SHORT]
    assert messages[0].level == checks.WARNING
    assert "LEASE_DURATION (0.9s) is below 1 s" in messages[0].msg
    assert leasejobs_messages({"LEASE_DURATION": 1, "HEARTBEAT_INTERVAL": 0.3}) == []


def test_w002_and_w004_on_the_observed_absurd_timings() -> None:
    # LEASE_DURATION 0.003: one idle worker made hundreds of commits a second.
    messages = leasejobs_messages({"LEASE_DURATION": 0.003, "HEARTBEAT_INTERVAL": 0.001})
    assert ids(messages) == [W_LEASE_TOO_SHORT, W_HEARTBEAT_TOO_FAST]
    # With the default heartbeat (10 s) that lease is an error as well.
    messages = leasejobs_messages({"LEASE_DURATION": 0.003})
    assert ids(messages) == [W_LEASE_TOO_SHORT, E_HEARTBEAT_NOT_BELOW_LEASE]


def test_w004_heartbeat_faster_than_ten_a_second() -> None:
    messages = leasejobs_messages({"LEASE_DURATION": 30, "HEARTBEAT_INTERVAL": 0.05})
    assert ids(messages) == [W_HEARTBEAT_TOO_FAST]
    assert messages[0].level == checks.WARNING
    assert "HEARTBEAT_INTERVAL (0.05s)" in messages[0].msg
    assert leasejobs_messages({"LEASE_DURATION": 30, "HEARTBEAT_INTERVAL": 0.1}) == []


def test_w003_poll_interval_below_50_ms() -> None:
    messages = leasejobs_messages({"POLL_INTERVAL": 0.01})
    assert ids(messages) == [W_POLL_TOO_FAST]
    assert messages[0].level == checks.WARNING
    assert "POLL_INTERVAL (0.01s) is below 0.05 s" in messages[0].msg
    assert leasejobs_messages({"POLL_INTERVAL": 0.05}) == []


# --------------------------------------------------------------------------- E005 / E006


def test_e005_unknown_database_alias() -> None:
    messages = leasejobs_messages({"DATABASE": "jobs"})
    assert ids(messages) == [E_UNKNOWN_DATABASE]
    assert "'jobs'" in messages[0].msg
    assert "default" in messages[0].hint


@pytest.mark.django_db
def test_database_feature_problem_is_empty_for_the_test_database() -> None:
    assert connections["default"].vendor in {"postgresql", "sqlite", "mysql"}
    assert leasejobs_checks.database_feature_problem("default") == ""


@pytest.fixture
def dummy_database(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A second, real DATABASES alias using Django's dummy backend (vendor 'unknown')."""
    alias = "legacy"
    databases = connections.configure_settings(
        {**connections.settings, alias: {"ENGINE": "django.db.backends.dummy"}}
    )
    monkeypatch.setitem(connections.settings, alias, databases[alias])
    if settings.DATABASES is not connections.settings:
        monkeypatch.setitem(settings.DATABASES, alias, databases[alias])
    assert alias in settings.DATABASES
    yield alias
    with contextlib.suppress(AttributeError):  # only there if the test connected
        del connections[alias]


def test_e006_unsupported_database_vendor(dummy_database: str) -> None:
    assert connections[dummy_database].vendor == "unknown"
    problem = leasejobs_checks.database_feature_problem(dummy_database)
    assert "'unknown'" in problem
    assert "not supported" in problem

    tasks = {
        **tasks_setting({}),
        "legacy": {"BACKEND": BACKEND, "OPTIONS": {"DATABASE": dummy_database}},
    }
    with override_settings(TASKS=tasks):
        messages = [m for m in run_checks() if str(m.id).startswith("leasejobs.")]
    assert ids(messages) == [E_DATABASE_FEATURES]
    assert messages[0].obj == "TASKS['legacy']"
    assert "'legacy'" in messages[0].msg
    assert "not supported" in messages[0].msg


# --------------------------------------------------------------------------- W006


def test_w006_id() -> None:
    assert W_FOREIGN_DATABASE_OPTION == "leasejobs.W006"


@pytest.mark.parametrize(
    ("vendor", "found"),
    [
        ("postgresql", ["transaction_mode", "init_command", "timeout", "check_same_thread"]),
        ("mysql", ["transaction_mode", "timeout", "check_same_thread"]),  # init_command is MySQL's
        ("sqlite", []),
        ("unknown", []),
    ],
)
def test_w006_which_sqlite_options_each_engine_refuses(vendor: str, found: list[str]) -> None:
    options = {
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL;",
        "timeout": 20,
        "check_same_thread": False,
        "sslmode": "require",  # PostgreSQL's own: not judged
        "charset": "utf8mb4",  # MySQL's own: not judged
        "isolation_level": "read committed",  # every engine's
    }
    assert leasejobs_checks.foreign_database_options(vendor, options) == found
    assert leasejobs_checks.foreign_database_options(vendor, None) == []


@pytest.fixture
def postgresql_alias(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A DATABASES alias on PostgreSQL that keeps the quickstart's SQLite OPTIONS (never
    connected to: the check must not need a connection)."""
    alias = "copied"
    entry = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "nowhere",
        "HOST": "127.0.0.1",
        "PORT": "1",
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20, "sslmode": "prefer"},
    }
    databases = connections.configure_settings({**connections.settings, alias: entry})
    monkeypatch.setitem(connections.settings, alias, databases[alias])
    if settings.DATABASES is not connections.settings:
        monkeypatch.setitem(settings.DATABASES, alias, databases[alias])
    yield alias
    with contextlib.suppress(AttributeError):
        del connections[alias]


def test_w006_sqlite_options_on_a_postgresql_database(postgresql_alias: str) -> None:
    tasks = {
        **tasks_setting({}),
        "copied": {"BACKEND": BACKEND, "OPTIONS": {"DATABASE": postgresql_alias}},
        "again": {"BACKEND": BACKEND, "OPTIONS": {"DATABASE": postgresql_alias}},
    }
    with override_settings(TASKS=tasks):
        messages = [m for m in run_checks() if str(m.id).startswith("leasejobs.")]
    # Once per database and key, however many backends use the database.
    assert ids(messages) == [W_FOREIGN_DATABASE_OPTION] * 2
    first, second = messages
    assert first.level == checks.WARNING
    assert first.obj == "DATABASES['copied']"
    assert first.msg == (
        "DATABASES['copied']['OPTIONS'] has 'transaction_mode', an SQLite option, on a "
        "PostgreSQL database, whose driver refuses it: the first query will fail "
        '(invalid connection option "transaction_mode").'
    )
    assert first.hint == (
        "Remove OPTIONS['transaction_mode'] from DATABASES['copied']: it is an SQLite option "
        "(keep it in the settings of an SQLite database only)."
    )
    assert "'timeout'" in second.msg
    assert second.hint.startswith("Remove OPTIONS['timeout'] from DATABASES['copied']")


def test_w006_looks_at_the_listen_database_too(postgresql_alias: str) -> None:
    if connections["default"].vendor != "postgresql":
        pytest.skip("LISTEN_DATABASE beside a PostgreSQL DATABASE")
    messages = leasejobs_messages({"LISTEN_DATABASE": postgresql_alias})
    assert ids(messages) == [W_FOREIGN_DATABASE_OPTION] * 2
    assert {m.obj for m in messages} == {"DATABASES['copied']"}


def test_w006_ignores_databases_no_backend_uses(postgresql_alias: str) -> None:
    assert leasejobs_messages({}) == []


@pytest.mark.slow
def test_w006_manage_py_check_warns_before_the_first_query_fails(
    run_manage: Any, subprocess_env: dict[str, str]
) -> None:
    """What a newcomer did: the quickstart's SQLite OPTIONS kept on another engine."""
    env = {
        **subprocess_env,
        "LEASEJOBS_TEST_DATABASE_OPTIONS": json.dumps({"transaction_mode": "IMMEDIATE"}),
    }
    checked = run_manage(["check"], env=env)
    if connections["default"].vendor == "mysql" and django.VERSION >= (6, 0):
        # Django 6's own model checks ask a MySQL/MariaDB server its version (native UUID
        # columns): `check` connects, and fails on the option before any warning can be
        # printed, with the driver's error naming it.
        assert checked.returncode != 0
        assert "transaction_mode" in checked.stderr, checked.stderr
        return
    assert checked.returncode == 0, checked.stderr  # a warning does not stop `check`
    output = checked.stdout + checked.stderr
    if connections["default"].vendor == "sqlite":
        assert "leasejobs.W006" not in output  # SQLite's own option
        return
    assert "DATABASES['default']: (leasejobs.W006)" in output, output
    assert "HINT: Remove OPTIONS['transaction_mode'] from DATABASES['default']" in output
    strict = run_manage(["check", "--fail-level", "WARNING"], env=env)
    assert strict.returncode != 0
    # ...which is what the warning is for: the first query fails.
    query = run_manage(["showmigrations", "django_leasejobs"], env=env)
    assert query.returncode != 0
    assert "transaction_mode" in query.stderr, query.stderr


# --------------------------------------------------------------------------- manage.py check


@pytest.mark.slow
def test_manage_py_check_fails_on_a_bad_setting(
    run_manage: Any, subprocess_env: dict[str, str]
) -> None:
    ok = run_manage(["check"])
    assert ok.returncode == 0, ok.stderr
    # None of ours. (On Django 6 `check` runs the models' database checks too: on
    # MySQL/MariaDB Django's own warnings name ``django_leasejobs.Job``'s partial indexes,
    # docs/configuration.md "MySQL and MariaDB".)
    assert "(leasejobs." not in ok.stdout + ok.stderr

    env = {**subprocess_env, LOCK_LOST_ENV_VAR: "sigbogus"}
    bad = run_manage(["check"], env=env)
    assert bad.returncode != 0
    assert "leasejobs.E003" in bad.stderr
    assert "sigbogus" in bad.stderr


@pytest.mark.slow
def test_a_lease_too_long_fails_check_and_the_worker_refuses_to_start(
    run_manage: Any, subprocess_env: dict[str, str]
) -> None:
    env = {**subprocess_env, "LEASEJOBS_TEST_OPTIONS": json.dumps({"LEASE_DURATION": 3e6})}
    for command in (["check"], ["runworker", "--concurrency", "1"]):
        refused = run_manage(command, env=env, timeout=60)
        assert refused.returncode != 0, (command, refused.stdout, refused.stderr)
        assert "leasejobs.E007" in refused.stderr, (command, refused.stderr)
        assert "tcp_user_timeout" in refused.stderr

    # Warnings do not stop a check (a worker starts with them, too).
    env = {**subprocess_env, "LEASEJOBS_TEST_OPTIONS": json.dumps({"POLL_INTERVAL": 0.01})}
    warned = run_manage(["check"], env=env)
    assert warned.returncode == 0, warned.stderr
    assert "leasejobs.W003" in warned.stdout + warned.stderr


# --------------------------------------------------------------------------- the app itself


def test_the_backend_without_the_app_installed_is_a_system_check_error() -> None:
    from django_leasejobs.compat import task_backends

    backend = task_backends["default"]
    assert [m for m in backend.check() if str(m.id).startswith("leasejobs.")] == []
    without = [app for app in settings.INSTALLED_APPS if app != "django_leasejobs"]
    with override_settings(INSTALLED_APPS=without):
        [message] = [m for m in backend.check() if str(m.id).startswith("leasejobs.")]
        # Django's tasks check (the backport's, on 5.2) runs every backend's check().
        reported = [m for m in run_checks() if m.id == E_APP_NOT_INSTALLED]
    assert message.id == E_APP_NOT_INSTALLED == "leasejobs.E008"
    assert message.level == checks.ERROR
    assert "'django_leasejobs' is not in INSTALLED_APPS" in message.msg
    assert message.hint == "Add 'django_leasejobs' to INSTALLED_APPS and run migrate."
    assert len(reported) == 1
