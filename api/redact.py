"""A URL fit to print: what logs, error messages and the CLI show of a
database URL or a planner service's address."""

from __future__ import annotations

__all__ = ["redact_url"]


def redact_url(url: str) -> str:
    """``url`` with the password of its user part and any ``password=`` query
    value replaced by ``***``; the rest as written.

    >>> redact_url("postgresql://planner:s3cret@db:5432/plans")
    'postgresql://planner:***@db:5432/plans'
    >>> redact_url("postgresql://db/plans?password=s3cret&sslmode=require")
    'postgresql://db/plans?password=***&sslmode=require'
    >>> redact_url("http://me:s3cret@[::1")  # malformed, and still redacted
    'http://me:***@[::1'
    """
    # By hand, not urllib.parse: a malformed URL must not leak its password in
    # the error that says it is malformed (urlsplit raises on "http://[::1").
    scheme, sep, rest = url.partition("://") if "://" in url else ("", "", url)
    end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    userinfo, at, host = authority.rpartition("@")
    if at and ":" in userinfo:
        authority = f"{userinfo.split(':', 1)[0]}:***@{host}"
    path, q, query = tail.partition("?")
    if q:
        query, h, fragment = query.partition("#")
        query = "&".join(
            f"{k}=***" if k.lower() == "password" else pair
            for pair in query.split("&")
            if pair
            for k, _, _ in [pair.partition("=")]
        )
        tail = f"{path}?{query}{h}{fragment}"
    return f"{scheme}{sep}{authority}{tail}"
