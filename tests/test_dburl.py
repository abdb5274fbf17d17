"""One parser for every command's database URL: libpq's URI and key-value forms, the
parameters Berth supports, the PG* environment for what the URL leaves out, and one line
naming a parameter Berth does not support."""

from __future__ import annotations

import pytest
from asyncpg.connect_utils import _parse_connect_dsn_and_args

from app.dburl import SUPPORTED, database_url_parse
from app.errors import ConfigurationError

NO_ENV: dict[str, str] = {}


def resolved(url: str, env: dict[str, str] | None = None) -> tuple:
    """Return what asyncpg makes of the URL's connect arguments: addresses, user, database,
    TLS mode (without reading the password file or any certificate)."""
    args = database_url_parse(url, environ=NO_ENV if env is None else env).connect_args(
        application_name="berth", timeout=5.0
    )
    addrs, params = _parse_connect_dsn_and_args(
        dsn=args["dsn"], host=None, port=None, user=None, password=None, passfile="/nonexistent",
        database=None, ssl=None, service=None, servicefile=None, direct_tls=None,
        server_settings=args["server_settings"], target_session_attrs=None, krbsrvname=None,
        gsslib=None,
    )
    return (addrs, params.user, params.password, params.database,
            params.target_session_attrs.value, params.server_settings)


@pytest.mark.parametrize(
    ("uri", "keywords"),
    [
        pytest.param("postgresql://u:p%40ss@h1:6001,h2:6002/db?target_session_attrs=read-write",
                     "host=h1,h2 port=6001,6002 user=u password=p@ss dbname=db "
                     "target_session_attrs=read-write", id="multi-host"),
        pytest.param("postgres://u@h/my%20db?application_name=a%20b",
                     "user=u host=h dbname='my db' application_name='a b'", id="quoted"),
        pytest.param("postgresql://u@[::1]:5433/d", "user=u host=::1 port=5433 dbname=d",
                     id="ipv6"),
        pytest.param("postgresql://u@/d?host=/tmp/pg", "user=u host=/tmp/pg dbname=d",
                     id="unix-socket"),
        pytest.param("postgresql://u@h1,h2:5433/d?port=5432,5432",
                     "user=u host=h1,h2 port=5432 dbname=d", id="one-port-every-host"),
        pytest.param("postgresql+asyncpg://u:it''s@h/d",
                     r"user=u password='it\'\'s' host=h dbname=d", id="driver-suffix-and-escapes"),
    ],
)
def test_the_two_forms_of_one_url_reach_asyncpg_alike(uri: str, keywords: str) -> None:
    assert resolved(uri) == resolved(keywords)


def test_asyncpg_reads_the_hosts_ports_user_and_database() -> None:
    addrs, user, password, database, attrs, settings = resolved(
        "host=h1,h2 port=6001,6002 user=u password=s3cret dbname=berth "
        "target_session_attrs=read-write application_name=orders options='-c work_mem=8MB'"
    )
    assert addrs == [("h1", 6001), ("h2", 6002)]
    assert (user, password, database, attrs) == ("u", "s3cret", "berth", "read-write")
    assert settings == {"application_name": "orders", "options": "-c work_mem=8MB"}


def test_the_urls_own_application_name_and_timeout_win_over_berths() -> None:
    given = database_url_parse("postgresql://h/d?application_name=orders&connect_timeout=9",
                               environ=NO_ENV)
    args = given.connect_args(application_name="berth-api", timeout=5.0)
    assert args["server_settings"] == {"application_name": "orders"}
    assert args["timeout"] == 9.0
    assert "connect_timeout" not in args["dsn"] and "application_name" not in args["dsn"]
    plain = database_url_parse("postgresql://h/d", environ=NO_ENV)
    assert plain.connect_args(application_name="berth-api", timeout=5.0) == {
        "dsn": "postgresql://h/d", "timeout": 5.0,
        "server_settings": {"application_name": "berth-api"},
    }


@pytest.mark.parametrize(
    ("seconds", "timeout"), [("0", 5.0), ("-1", 5.0), ("1", 2.0), ("30", 30.0)]
)
def test_connect_timeout_is_read_as_libpq_reads_it(seconds: str, timeout: float) -> None:
    given = database_url_parse(f"host=h connect_timeout={seconds}", environ=NO_ENV)
    assert given.connect_args(application_name="b", timeout=5.0)["timeout"] == timeout


def test_the_environment_fills_what_the_url_leaves_out() -> None:
    env = {"PGAPPNAME": "from-env", "PGCONNECT_TIMEOUT": "7", "PGOPTIONS": "-c work_mem=4MB",
           "PGSSLMODE": "require", "PGTARGETSESSIONATTRS": "primary"}
    given = database_url_parse("postgresql://h/d?sslmode=verify-full", environ=env)
    assert given.get("sslmode") == "verify-full"  # the URL wins
    assert given.get("target_session_attrs") == "primary"
    args = given.connect_args(application_name="b", timeout=5.0)
    assert args["timeout"] == 7.0
    assert args["server_settings"] == {"application_name": "from-env",
                                       "options": "-c work_mem=4MB"}


def test_every_supported_parameter_is_accepted() -> None:
    values = {"port": "5432", "sslmode": "verify-full", "connect_timeout": "5",
              "target_session_attrs": "read-write"}
    pairs = " ".join(f"{name}={values.get(name, 'x')}" for name in SUPPORTED)
    given = database_url_parse(pairs, environ=NO_ENV)
    assert {name for name, _ in given.params} == set(SUPPORTED)


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        pytest.param("postgresql://h/d?keepalives=1", "parameter 'keepalives' is not supported",
                     id="unsupported-uri"),
        pytest.param("host=h sslcrl=/x", "parameter 'sslcrl' is not supported",
                     id="unsupported-keyword"),
        pytest.param("postgresql://h/d?sslmode=on", "sslmode='on'", id="bad-sslmode"),
        pytest.param("host=h connect_timeout=5s", "connect_timeout='5s'", id="bad-timeout"),
        pytest.param("host=h,h2,h3 port=1,2", "3 hosts but 2 ports", id="ports-hosts"),
        pytest.param("host=h port=99999", "port '99999'", id="bad-port"),
        pytest.param("host='h", "is not keyword=value", id="unclosed-quote"),
        pytest.param("mysql://u:pw@h/d", "scheme 'mysql'", id="other-scheme"),
        pytest.param("just words", "neither a postgresql:// URI", id="not-a-url"),
    ],
)
def test_an_unusable_url_is_one_line_naming_the_fault(url: str, needle: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        database_url_parse(url, environ=NO_ENV)
    message = str(caught.value)
    assert needle in message and "BERTH_DATABASE_URL" in message
    assert "\n" not in message and "pw" not in message


def test_a_bad_value_in_the_environment_is_named_too() -> None:
    with pytest.raises(ConfigurationError, match="sslmode='maybe'"):
        database_url_parse("postgresql://h/d", environ={"PGSSLMODE": "maybe"})


def test_the_url_is_described_without_its_password() -> None:
    given = database_url_parse("host=h1,h2 password=hunter2 user=u sslmode=require",
                               environ=NO_ENV)
    assert given.describe() == "postgresql://u:***@h1,h2?sslmode=require"
    assert "hunter2" in given.dsn
    assert given.with_database("other").get("dbname") == "other"
