"""Replace personal data with placeholders, not deletion (SPEC §7 "PII").

E-mail addresses → ``<EMAIL>``, phone numbers → ``<PHONE>``, IPv4/IPv6 addresses → ``<IP>``. Version strings
(``version 10.2.0.1``, ``v1.2.3.4``, ``1.2.3.4.5``) and decimals are left alone: SPEC §7 requires it, and
technical text is full of them.
"""

import ipaddress
import re

_EMAIL_RE = re.compile(r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}(?![\w-])")
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
# Not glued to letters, digits or further dots: "1.2.3.4.5" and "v10.2.0.1" are versions.
_IPV4_RE = re.compile(rf"(?<![\w.])(?:{_OCTET}\.){{3}}{_OCTET}(?![\w]|\.\d)")
# A word announcing a version right before the number: "version 10.2.0.1", "release 4.1.0.3".
_VERSION_CONTEXT_RE = re.compile(
    r"(?i)\b(?:v|ver|version|versions|release|rel|build|rev|revision|update|firmware|kernel|python|"
    r"版本|版)\W{0,3}$"
)
_IPV6_RE = re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:])")
# International (+cc ...), bracketed area code, or the NANP 3-3-4 form; bare digit runs and decimals never match.
_PHONE_RE = re.compile(
    r"(?<![\w+])(?:"
    r"\+\d{1,3}(?:[ -]?\(?\d{1,4}\)?){2,5}"
    r"|\(\d{2,4}\)[ ]?\d{3,4}[ -]\d{3,4}"
    r"|\d{3}([-.])\d{3}\1\d{4}"
    r")(?![\w])"
)


def _ipv4(m: re.Match[str]) -> str:
    if _VERSION_CONTEXT_RE.search(m.string[max(0, m.start() - 16):m.start()]):
        return m.group(0)
    return "<IP>"


def _ipv6(m: re.Match[str]) -> str:
    text = m.group(0)
    groups = [g for g in text.split(":") if g]
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return text
    # "a[::2]" or "1::2" in code are slices, not addresses: ask for a few hex groups.
    return "<IP>" if len(groups) >= 3 else text


def _phone(m: re.Match[str]) -> str:
    digits = sum(c.isdigit() for c in m.group(0))
    return "<PHONE>" if 7 <= digits <= 15 else m.group(0)  # E.164 allows at most 15 digits


def redact(text: str) -> tuple[str, int]:
    """Replace e-mails, IP addresses and phone numbers by placeholders; returns (text, replacements made)."""
    total = 0
    for pattern, repl in ((_EMAIL_RE, "<EMAIL>"), (_IPV6_RE, _ipv6), (_IPV4_RE, _ipv4), (_PHONE_RE, _phone)):
        text, n = _sub_counted(pattern, repl, text)
        total += n
    return text, total


def _sub_counted(pattern: re.Pattern[str], repl, text: str) -> tuple[str, int]:
    """``pattern.subn`` that counts only matches actually changed (callbacks may keep a match)."""
    changed = 0

    def wrapped(m: re.Match[str]) -> str:
        nonlocal changed
        out = repl if isinstance(repl, str) else repl(m)
        changed += out != m.group(0)
        return out

    return pattern.sub(wrapped, text), changed
