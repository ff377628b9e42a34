"""URL rules of the corpus build (docs/methods.md §7 "URL filtering"): a document's host against domain lists and its
URL against substrings, before any other per-document stage reads its content.

Hosts and list entries are put in one normal form (``normal_host``) and then compared as strings:

- userinfo, port, percent-escapes and trailing dots are dropped, and the host is lower-cased;
- an internationalised host is encoded to its ASCII (punycode) form with the standard library's ``idna`` codec
  (IDNA 2003 nameprep: NFKC and case folding, full-width dots read as dots; note that it maps ß to ss and ς to σ);
- one leading ``www.`` label is dropped when at least two labels remain, from hosts and list entries alike, so
  ``www.example.com`` and ``example.com`` are one site (``www.com`` stays itself);
- an IP address is written in its canonical form (``ipaddress``) and only ever matches itself.

A domain matches itself and every subdomain, label by label: ``example.com`` matches ``a.example.com``, not
``badexample.com``. A list entry may start with ``*.`` or ``.``, which means the same as the bare domain.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence
from urllib.parse import unquote, urlsplit

from infra.errors import ConfigError

BLOCKLIST = "url.blocklist"
NOT_ALLOWED = "url.not_allowed"
# After normalisation: LDH labels (underscores too: they occur in real hostnames) separated by dots.
_DOMAIN_RE = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?)*$")


def normal_host(host: str) -> str | None:
    """The normal form of a host name or IP address (module docstring); None when nothing is left.

    ``host`` has no userinfo or port (see ``url_host``). A name the ``idna`` codec refuses (an empty or over-long
    label) is kept lower-cased as it is, so it still matches an identical entry.
    """
    host = unquote(host).strip().lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        return None
    try:
        return ipaddress.ip_address(host).compressed
    except ValueError:
        pass
    try:
        host = host.encode("idna").decode("ascii").lower().rstrip(".")
    except UnicodeError:
        pass
    labels = host.split(".")
    if labels[0] == "www" and len(labels) > 2:
        host = ".".join(labels[1:])
    return host or None


def url_host(url: str) -> str | None:
    """The normal host of ``url`` (``normal_host``), or None when it has none (``mailto:``, a bare path) or cannot
    be parsed. A URL without ``//`` whose first part looks like a domain (``example.com/page``) is read host first."""
    text = url.strip()
    try:
        parts = urlsplit(text)
        if not parts.netloc and (not parts.scheme or "." in parts.scheme):
            parts = urlsplit("//" + text)
        host = parts.hostname
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return None
    return normal_host(host) if host else None


def normal_domain(entry: str) -> str:
    """A list entry (a domain, ``*.domain``, ``.domain`` or an IP address) in the normal form of ``normal_host``.

    Raises:
        ValueError: the entry is empty or not a domain name (spaces, ``/``, ``@``, an empty label, ...).
    """
    text = entry.strip()
    for prefix in ("*.", "."):
        if text.startswith(prefix):
            text = text[len(prefix):]
            break
    host = normal_host(text) if text else None
    if host is None or not (_is_ip(host) or _DOMAIN_RE.match(host)):
        raise ValueError(f"{entry!r} is not a domain name (e.g. 'example.com' or 'bücher.de')")
    return host


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def read_domain_file(path: str) -> tuple[str, ...]:
    """The domains of a blocklist file: UTF-8, one domain per line, ``#`` to the end of a line a comment, blank lines
    ignored; each in the normal form of ``normal_domain``. Relative paths are read from the working directory.
    Read once per process while the file's size and modification time stay the same.

    Raises:
        ConfigError: the file does not exist, cannot be read, is not UTF-8, or a line is not a domain (the
            message names the file and the line).
    """
    try:
        stat = os.stat(path)
    except OSError as err:
        raise ConfigError(f"blocklist file {path!r} cannot be read ({err.strerror}; relative paths are read from "
                          "the working directory); fix the path or remove it from blocklist_files") from None
    if not Path(path).is_file():
        raise ConfigError(f"blocklist file {path!r} is not a file; list files of domains, one per line")
    return _read_domains(os.path.abspath(path), stat.st_mtime_ns, stat.st_size, stat.st_ino)


@lru_cache(maxsize=16)
def _read_domains(path: str, mtime_ns: int, size: int, inode: int) -> tuple[str, ...]:
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise ConfigError(f"blocklist file {path!r} is not UTF-8 (byte {err.start}); re-save it as UTF-8") from None
    except OSError as err:
        raise ConfigError(f"blocklist file {path!r} cannot be read ({err.strerror})") from None
    domains = []
    for n, line in enumerate(text.splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if entry:
            try:
                domains.append(normal_domain(entry))
            except ValueError as err:
                raise ConfigError(f"blocklist file {path!r} line {n}: {err}") from None
    return tuple(domains)


def files_digest(paths: Sequence[str]) -> str:
    """sha256[:16] of the sorted distinct domains of each blocklist file (``read_domain_file``), in list order: what
    the files hold, so comments, order and repeats leave it unchanged. Raises as ``read_domain_file``."""
    content = [sorted(set(read_domain_file(p))) for p in paths]
    return hashlib.sha256(json.dumps(content).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class UrlRules:
    """Compiled URL rules: ``blocked`` and ``allowed`` domains in normal form, ``substrings`` case-folded."""

    blocked: frozenset[str] = frozenset()
    substrings: tuple[str, ...] = ()
    allowed: frozenset[str] = frozenset()

    @property
    def active(self) -> bool:
        """Whether any rule can remove a document."""
        return bool(self.blocked or self.substrings or self.allowed)

    def check(self, url: object) -> tuple[str, str] | None:
        """(rule, detail) of the first rule that removes ``url``, or None to keep it. Order: blocked domain, blocked
        substring, allowlist; a value that is not a non-blank string (no URL) is always kept.

        ``url.blocklist``: the host is a blocked domain or under one (detail names the domain), or the case-folded
        URL contains a blocked substring (detail names it); ``url.not_allowed``: an allowlist is set and the host
        is neither an allowed domain nor under one (detail names the host).
        """
        if not isinstance(url, str) or not url.strip():
            return None
        host = url_host(url)
        if host is not None and self.blocked:
            domain = _under(host, self.blocked)
            if domain is not None:
                return BLOCKLIST, f"blocked domain {domain} (host {host})"
        if self.substrings:
            folded = url.casefold()
            for sub in self.substrings:
                if sub in folded:
                    return BLOCKLIST, f"blocked substring {sub!r} in the URL"
        if self.allowed and (host is None or _under(host, self.allowed) is None):
            return NOT_ALLOWED, f"host {host} is not under an allowed domain" if host else "the URL has no host"
        return None


def _under(host: str, domains: frozenset[str]) -> str | None:
    """The most specific of ``domains`` that ``host`` is or lies under, label by label; an IP only matches itself."""
    if _is_ip(host):
        return host if host in domains else None
    labels = host.split(".")
    for i in range(len(labels)):
        candidate = ".".join(labels[i:])
        if candidate in domains:
            return candidate
    return None


def compile_rules(blocklist: Sequence[str], blocklist_files: Sequence[str], substrings: Sequence[str],
                  allowlist: Sequence[str]) -> UrlRules:
    """``UrlRules`` from config lists (entries as ``normal_domain`` takes them); compiled once per process for the
    same lists and unchanged files. Raises ConfigError as ``read_domain_file``, ValueError as ``normal_domain``."""
    stamps = tuple((p, *_stamp(p)) for p in blocklist_files)
    return _compiled(tuple(blocklist), stamps, tuple(substrings), tuple(allowlist))


def _stamp(path: str) -> tuple[int, int]:
    try:
        stat = os.stat(path)
    except OSError:
        return (0, -1)  # read_domain_file raises the error that names it
    return (stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=4)
def _compiled(blocklist: tuple[str, ...], stamps: tuple[tuple[str, int, int], ...], substrings: tuple[str, ...],
              allowlist: tuple[str, ...]) -> UrlRules:
    blocked = {normal_domain(d) for d in blocklist}
    for path, *_ in stamps:
        blocked.update(read_domain_file(path))
    return UrlRules(blocked=frozenset(blocked), substrings=tuple(s.casefold() for s in substrings),
                    allowed=frozenset(normal_domain(d) for d in allowlist))
