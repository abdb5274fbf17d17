"""PostgreSQL connection URLs as libpq reads them, one parser for every Berth command.

A URL comes in either of libpq's forms:

- URI: ``postgresql://user:password@h1:5432,h2:5432/dbname?sslmode=verify-full&…``
  (``postgres://`` too; a ``+driver`` suffix is ignored: Berth always connects with asyncpg);
- key-value: ``host=h1,h2 port=5432,5432 dbname=berth sslmode=require``
  (values may be single-quoted, with ``\\'`` and ``\\\\`` escapes).

asyncpg reads most of libpq's URI itself: several hosts, ports, user, password, dbname,
``sslmode``, ``sslrootcert``, ``sslcert``, ``sslkey``, ``passfile``, ``target_session_attrs``
and the ``PG*`` environment variables of those. This module fills only what it lacks: the
key-value form; ``connect_timeout`` (asyncpg's ``timeout=``); ``application_name`` and
``options`` as startup parameters that win over Berth's own application name; the
``PGAPPNAME``, ``PGCONNECT_TIMEOUT`` and ``PGOPTIONS`` variables; and a check, before any
connection, that every parameter is one Berth supports with a value it can take. A
parameter it does not support is refused with one line naming it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode

from app.errors import ConfigurationError

__all__ = ["SESSION_ATTRS", "SSL_MODES", "SUPPORTED", "DatabaseUrl", "database_url_parse"]

#: libpq's ``sslmode`` values, weakest first.
SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
#: libpq's ``target_session_attrs`` values (asyncpg takes them all).
SESSION_ATTRS = ("any", "primary", "standby", "prefer-standby", "read-write", "read-only")

#: The parameters Berth reads, each with the environment variable used when the URL leaves
#: it out (None: asyncpg reads that variable itself, together with its defaults and
#: the password file).
SUPPORTED: dict[str, str | None] = {
    "host": None,
    "port": None,
    "dbname": None,
    "user": None,
    "password": None,
    "passfile": "PGPASSFILE",
    "sslmode": "PGSSLMODE",
    "sslrootcert": "PGSSLROOTCERT",
    "sslcert": "PGSSLCERT",
    "sslkey": "PGSSLKEY",
    "application_name": "PGAPPNAME",
    "connect_timeout": "PGCONNECT_TIMEOUT",
    "target_session_attrs": "PGTARGETSESSIONATTRS",
    "options": "PGOPTIONS",
}
#: The parameters asyncpg does not take in its DSN: they become connect arguments.
_ARGUMENTS = ("application_name", "connect_timeout", "options")

_SCHEME = re.compile(r"(?P<scheme>postgresql|postgres)(?:\+\w+)?://", re.I)
_OTHER_SCHEME = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://")
_HOST = re.compile(r"(?P<host>\[[0-9A-Fa-f:.%\w]+\]|[^\[\]:,]*)(?::(?P<port>[^,]*))?")
#: One ``keyword = value`` of the key-value form; a value is quoted or runs to whitespace.
_PAIR = re.compile(
    r"\s*(?P<key>[A-Za-z_][A-Za-z0-9_]*)\s*=\s*"
    r"(?:'(?P<quoted>(?:[^'\\]|\\.)*)'|(?P<bare>(?:[^\s'\\]|\\.)*))\s*"
)
#: Hosts that read plainly in a URI's authority: names and IPv4 addresses, with ports.
_AUTHORITY_HOSTS = re.compile(r"[A-Za-z0-9._-]+(?::\d+)?(?:,[A-Za-z0-9._-]+(?::\d+)?)*")

_EXAMPLE = "postgresql://user:password@host1:5432,host2:5432/dbname?sslmode=verify-full"


def _bad(source: str, why: str) -> ConfigurationError:
    return ConfigurationError(f"{source} is not a usable PostgreSQL URL: {why} (e.g. {_EXAMPLE})")


@dataclass(frozen=True)
class DatabaseUrl:
    """A parsed PostgreSQL URL: libpq's parameters, as given or taken from the environment."""

    params: tuple[tuple[str, str], ...]

    def get(self, name: str) -> str | None:
        """Return the value of parameter ``name``, or None when it is not set."""
        return dict(self.params).get(name)

    @property
    def dsn(self) -> str:
        """The URI asyncpg is given: every parameter it reads itself, password included."""
        return _uri({k: v for k, v in self.params if k not in _ARGUMENTS}, hide_password=False)

    def uri(self, *, hide_password: bool = False) -> str:
        """Return the URL in URI form, every parameter included."""
        return _uri(dict(self.params), hide_password=hide_password)

    def describe(self) -> str:
        """Return the URL in URI form with its password hidden, for logs and messages."""
        return self.uri(hide_password=True)

    def with_database(self, name: str) -> DatabaseUrl:
        """Return this URL naming database ``name`` instead."""
        return DatabaseUrl((*((k, v) for k, v in self.params if k != "dbname"), ("dbname", name)))

    def connect_args(self, *, application_name: str, timeout: float) -> dict[str, Any]:
        """Return the keyword arguments of ``asyncpg.connect`` (and ``create_pool``).

        ``application_name`` and ``timeout`` are Berth's: the URL's own ``application_name``
        and ``connect_timeout`` win over them, as libpq's win over a fallback.
        """
        given = dict(self.params)
        settings = {"application_name": given.get("application_name", application_name)}
        if "options" in given:
            settings["options"] = given["options"]
        # libpq: zero or less is no timeout of the URL's; less than 2 s is 2 s.
        seconds = int(given.get("connect_timeout", "0"))
        return {
            "dsn": self.dsn,
            "timeout": float(max(seconds, 2)) if seconds > 0 else timeout,
            "server_settings": settings,
        }


def _uri(params: Mapping[str, str], *, hide_password: bool) -> str:
    rest = dict(params)
    user, password = rest.pop("user", None), rest.pop("password", None)
    auth = ""
    if user is not None or password is not None:
        auth = quote(user or "", safe="")
        if password is not None:
            auth += ":" + ("***" if hide_password else quote(password, safe=""))
        auth += "@"
    hosts = ""
    if "host" in rest and "port" not in rest and _AUTHORITY_HOSTS.fullmatch(rest["host"]):
        hosts = rest.pop("host")
    path = "/" + quote(rest.pop("dbname"), safe="") if "dbname" in rest else ""
    query = "?" + urlencode(rest, safe="/,:[]", quote_via=quote) if rest else ""
    return f"postgresql://{auth}{hosts}{path}{query}"


def database_url_parse(
    url: str, *, source: str = "BERTH_DATABASE_URL", environ: Mapping[str, str] | None = None
) -> DatabaseUrl:
    """Parse ``url`` (URI or key-value form) and check it, or raise ConfigurationError with
    one line naming what is wrong; ``source`` names where the URL came from."""
    text = url.strip()
    if _SCHEME.match(text):
        given = _uri_params(text, source)
    elif (other := _OTHER_SCHEME.match(text)) is not None:
        raise _bad(source, f"scheme {other['scheme']!r} is not postgresql")
    elif not text or "=" in text:
        given = _keyword_params(text, source)
    else:
        raise _bad(source, "neither a postgresql:// URI nor keyword=value pairs")
    env = os.environ if environ is None else environ
    for name, var in SUPPORTED.items():
        if var is not None and name not in given and env.get(var):
            given[name] = env[var]
    _check(given, source)
    hosts, ports = given.get("host", "").split(","), given.get("port", "").split(",")
    if "host" in given and "port" in given and len(ports) == 1 < len(hosts):
        given["port"] = ",".join(ports * len(hosts))  # one port for every host, as in libpq
    return DatabaseUrl(tuple(given.items()))


def _uri_params(url: str, source: str) -> dict[str, str]:
    """Return the parameters of a URI, query parameters last (they win, as in libpq)."""
    m = _SCHEME.match(url)
    assert m is not None
    rest, _, _fragment = url[m.end():].partition("#")
    authority_path, _, query_text = rest.partition("?")
    authority, slash, path = authority_path.partition("/")
    userinfo, at, hostlist = authority.rpartition("@")
    given: dict[str, str] = {}
    if at:
        user_text, colon, password_text = userinfo.partition(":")
        if user_text:
            given["user"] = unquote(user_text)
        if colon:
            given["password"] = unquote(password_text)
    if hostlist:
        given["host"] = _hosts(hostlist, source)
    if slash and path:
        given["dbname"] = unquote(path)
    try:
        query = parse_qsl(query_text, keep_blank_values=True, strict_parsing=bool(query_text))
    except ValueError:
        raise _bad(source, f"query {query_text!r} is not name=value&…") from None
    for name, value in query:
        if value:
            given[name] = value
    return given


def _hosts(hostlist: str, source: str) -> str:
    """Check a URI's comma-separated ``host[:port]`` list; return it percent-decoded."""
    out = []
    for item in hostlist.split(","):
        h = _HOST.fullmatch(unquote(item))
        if h is None or not h["host"]:
            raise _bad(source, f"host {item!r} is not host or host:port")
        port = h["port"]
        if port is not None:
            _port_check(port, source)
        out.append(h["host"] if port is None else f"{h['host']}:{port}")
    return ",".join(out)


def _keyword_params(text: str, source: str) -> dict[str, str]:
    """Return the parameters of libpq's key-value form."""
    given: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        m = _PAIR.match(text, pos)
        if m is None or m.end() == pos:
            raise _bad(source, f"{text[pos:pos + 30]!r} is not keyword=value")
        raw = m["quoted"] if m["quoted"] is not None else m["bare"]
        value = re.sub(r"\\(.)", r"\1", raw)
        if value:
            given[m["key"]] = value
        pos = m.end()
    if "host" in given:
        # An IPv6 address goes in brackets, as a URI writes it (its colons are no port).
        given["host"] = ",".join(
            f"[{h}]" if ":" in h and not h.startswith(("/", "[")) else h
            for h in given["host"].split(",")
        )
    return given


def _port_check(port: str, source: str) -> None:
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise _bad(source, f"port {port!r} is not 1..65535")


def _check(given: Mapping[str, str], source: str) -> None:
    """Raise ConfigurationError for the first parameter Berth cannot take."""
    for name, value in given.items():
        if name not in SUPPORTED:
            raise ConfigurationError(
                f"{source}: parameter {name!r} is not supported; Berth reads "
                f"{', '.join(SUPPORTED)}"
            )
        if name == "sslmode" and value not in SSL_MODES:
            raise _bad(source, f"sslmode={value!r}: use one of {', '.join(SSL_MODES)}")
        if name == "target_session_attrs" and value not in SESSION_ATTRS:
            raise _bad(
                source, f"target_session_attrs={value!r}: use one of {', '.join(SESSION_ATTRS)}"
            )
        if name == "connect_timeout" and not re.fullmatch(r"-?\d+", value):
            raise _bad(source, f"connect_timeout={value!r} is not a whole number of seconds")
        if name == "port":
            for port in value.split(","):
                _port_check(port, source)
    hosts = given.get("host", "").split(",")
    ports = given.get("port", "").split(",")
    if "host" in given and "port" in given and len(ports) not in (1, len(hosts)):
        raise _bad(source, f"{len(hosts)} hosts but {len(ports)} ports")
