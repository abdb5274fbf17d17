"""Multi-host PostgreSQL URLs: ``postgresql://u:p@h1:5432,h2:5432/db?target_session_attrs=…``.

A highly available PostgreSQL (pg_auto_failover, Patroni) hands its clients one URL naming
every node; the client tries them in order and keeps the first that matches
``target_session_attrs`` (``read-write``: the primary). asyncpg understands that URL as it
is. SQLAlchemy's URL parser does not (it reads ``6001,h2:6002`` as a port), and its asyncpg
dialect wants the hosts as repeated ``host=h:p`` query parameters instead; Alembic is the
only user of that form.

The parser here is deliberately small: it checks what Berth must know (the scheme, every
port, a known ``target_session_attrs``) and renders the three forms Berth needs without
touching anything else of the URL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, unquote, urlencode

from app.errors import ConfigurationError

__all__ = ["MultiHostUrl", "multi_host_parse"]

#: What asyncpg accepts for ``target_session_attrs`` (libpq's values).
SESSION_ATTRS = ("any", "primary", "standby", "prefer-standby", "read-write", "read-only")

_SCHEME = re.compile(r"(?P<scheme>postgresql|postgres)(?:\+(?P<driver>\w+))?://", re.I)
_HOST = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[^\[\]:/?#@,]*)(?::(?P<port>[^,]*))?")

_EXAMPLE = "postgresql://user:password@host1:5432,host2:5432/dbname?target_session_attrs=read-write"


def _bad(url: str, why: str) -> ConfigurationError:
    return ConfigurationError(
        f"BERTH_DATABASE_URL {MultiHostUrl.hide(url)!r} is not a usable PostgreSQL URL ({why}); "
        f"use {_EXAMPLE}"
    )


@dataclass(frozen=True)
class MultiHostUrl:
    """A parsed multi-host URL: user, password, (host, port) pairs, database and query."""

    user: str | None
    password: str | None
    hosts: tuple[tuple[str, int | None], ...]
    database: str | None
    query: tuple[tuple[str, str], ...]

    @staticmethod
    def hide(url: str) -> str:
        """Return ``url`` with the password of its user part replaced by ``***``."""
        m = _SCHEME.match(url)
        if m is None:
            return url
        rest = url[m.end():]
        netloc_end = len(rest)
        for sep in "/?#":
            i = rest.find(sep)
            if i != -1:
                netloc_end = min(netloc_end, i)
        netloc = rest[:netloc_end]
        if "@" not in netloc:
            return url
        userinfo, hosts = netloc.rsplit("@", 1)
        if ":" not in userinfo:
            return url
        user = userinfo.split(":", 1)[0]
        return f"{url[:m.end()]}{user}:***@{hosts}{rest[netloc_end:]}"

    def _auth(self, *, hide_password: bool) -> str:
        if self.user is None:
            return ""
        auth = quote(self.user, safe="")
        if self.password is not None:
            auth += ":" + ("***" if hide_password else quote(self.password, safe=""))
        return auth + "@"

    @staticmethod
    def _host(host: str, port: int | None) -> str:
        return host if port is None else f"{host}:{port}"

    def libpq(self, *, hide_password: bool = False) -> str:
        """Return the URL in libpq's form (asyncpg's DSN): hosts comma-separated."""
        hosts = ",".join(self._host(h, p) for h, p in self.hosts)
        query = f"?{urlencode(self.query)}" if self.query else ""
        return (
            f"postgresql://{self._auth(hide_password=hide_password)}{hosts}/"
            f"{quote(self.database or '', safe='')}{query}"
        )

    def sqlalchemy(self, drivername: str) -> str:
        """Return the URL in SQLAlchemy's multi-host form: ``host=h:p`` query parameters."""
        query = [("host", self._host(h, p)) for h, p in self.hosts] + list(self.query)
        return (
            f"{drivername}://{self._auth(hide_password=False)}/"
            f"{quote(self.database or '', safe='')}?{urlencode(query)}"
        )


def multi_host_parse(url: str) -> MultiHostUrl | None:
    """Parse ``url`` if it names several hosts (None if it does not), or raise
    ConfigurationError saying what is wrong with it."""
    m = _SCHEME.match(url)
    if m is None:
        return None
    rest = url[m.end():]
    rest, _, _fragment = rest.partition("#")
    netloc_and_path, _, query_text = rest.partition("?")
    netloc, slash, path = netloc_and_path.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    if "," not in hostlist:
        return None
    if m["driver"] not in (None, "asyncpg"):
        raise _bad(url, f"driver {m['driver']!r}: Berth connects with asyncpg")
    user = password = None
    if at:
        user_text, colon, password_text = userinfo.partition(":")
        user = unquote(user_text)
        password = unquote(password_text) if colon else None
    hosts: list[tuple[str, int | None]] = []
    for item in hostlist.split(","):
        h = _HOST.fullmatch(item)
        if h is None or not h["host"]:
            raise _bad(url, f"host {item!r} is not host or host:port")
        port_text = h["port"]
        port: int | None = None
        if port_text is not None:
            if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
                raise _bad(url, f"port {port_text!r} of host {h['host']!r} is not 1..65535")
            port = int(port_text)
        hosts.append((h["host"], port))
    try:
        query = tuple(parse_qsl(query_text, keep_blank_values=True, strict_parsing=True))
    except ValueError:
        raise _bad(url, f"query {query_text!r} is not name=value&…") from None
    for name, value in query:
        if name == "host":
            raise _bad(url, "hosts go before the database name, not in host= parameters")
        if name == "target_session_attrs" and value not in SESSION_ATTRS:
            raise _bad(
                url, f"target_session_attrs={value!r}: use one of {', '.join(SESSION_ATTRS)}"
            )
    database = unquote(path) if slash and path else None
    return MultiHostUrl(user, password, tuple(hosts), database, query)
