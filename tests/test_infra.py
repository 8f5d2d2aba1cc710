"""The test infrastructure itself: database, app tables, subprocesses."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib.auth.models import User
from django.db import connection

USER_COUNT_SCRIPT = (
    "from django.contrib.auth.models import User; "
    "print('user-count=%d' % User.objects.count()); "
    "print('usernames=' + ','.join(User.objects.order_by('username')"
    ".values_list('username', flat=True)))"
)


@pytest.mark.django_db
def test_database_is_reachable() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)
    assert connection.vendor in {"postgresql", "sqlite", "mysql"}


@pytest.mark.django_db
def test_test_database_is_shareable() -> None:
    name = str(connection.settings_dict["NAME"])
    if connection.vendor == "sqlite":
        # A file, not memory: other connections and processes must see the same data.
        assert name != ":memory:" and not name.startswith("file:")
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode")
            assert cursor.fetchone()[0].lower() == "wal"
    else:
        assert name.startswith("test_")


@pytest.mark.django_db
def test_app_tables_exist() -> None:
    models = [
        model
        for model in apps.get_app_config("django_leasejobs").get_models()
        if model._meta.managed and not model._meta.proxy
    ]
    if not models:
        pytest.skip("django_leasejobs defines no models yet")
    tables = set(connection.introspection.table_names())
    missing = sorted(model._meta.db_table for model in models if model._meta.db_table not in tables)
    assert not missing, f"tables not created by the migrations: {missing}"


@pytest.mark.django_db(transaction=True)
def test_subprocess_sees_committed_rows(run_manage) -> None:
    User.objects.create_user("infra-alice")
    User.objects.create_user("infra-bob")

    done = run_manage(["shell", "-c", USER_COUNT_SCRIPT], timeout=120)

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "user-count=2" in lines, done.stdout
    assert "usernames=infra-alice,infra-bob" in lines, done.stdout


def test_subprocess_env_names_the_test_database(subprocess_env) -> None:
    assert subprocess_env["DJANGO_SETTINGS_MODULE"] == "tests.settings"
    assert subprocess_env["LEASEJOBS_TEST_SUBPROCESS"] == "1"
    url = subprocess_env["DATABASE_URL"]
    if connection.vendor == "sqlite":
        assert url.startswith("sqlite:///")
    else:
        assert "/test_" in url


@pytest.mark.parametrize(
    "settings_dict",
    [
        {"ENGINE": "django.db.backends.sqlite3", "NAME": "/srv/some dir/test+1.sqlite3"},
        {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "test_postgres",
            "USER": "postgres",
            "HOST": "/run/leasejobs pg+x/pgdata",
            "PORT": 5432,
        },
        {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "test_test",
            "USER": "app",
            "PASSWORD": "p@ss:w/rd",
            "HOST": "127.0.0.1",
            "PORT": 5433,
            "OPTIONS": {"sslmode": "disable"},
        },
    ],
    ids=["sqlite", "postgres-socket", "postgres-tcp"],
)
def test_database_url_round_trips(settings_dict: dict[str, object]) -> None:
    import environ

    from testproject.embedded_db import settings_to_database_url

    parsed = environ.Env.db_url_config(settings_to_database_url(settings_dict))

    for key, value in settings_dict.items():
        assert parsed[key] == value, key
