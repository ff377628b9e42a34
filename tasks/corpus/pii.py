"""Replace personal data with placeholders, not deletion (docs/methods.md §7 "PII").

E-mail addresses → ``<EMAIL>``, IPv4/IPv6 addresses → ``<IP>``, phone numbers → ``<PHONE>``. Only the address or
number itself is replaced: quotes, brackets, commas and sentence-final dots around it stay.

What is left alone, so technical text keeps its numbers:

* Version strings. A dotted quad is an IPv4 address only if ``ipaddress.IPv4Address`` accepts it (octets 0–255,
  no leading zeros), it is not glued to letters, digits or further dots ("v10.2.0.1", "1.2.3.4.5"), and the
  16 characters before it do not end in a version word followed by at most 3 non-word characters ("version
  10.2.0.1", "Version: 1.10.0.0", "release 4.1.0.3", "build 1.2.3.4", "firmware 2.0.0.1", "版本 1.0.0.1").
  A valid dotted quad without such context ("server 10.2.0.1") is redacted.
* Decimals and IDs: bare digit runs ("0.250750683890174", "4829174650192"), dates, times, hex IDs and UUIDs never
  match the phone or address patterns.
* IPv6-looking code: a candidate must be a valid ``ipaddress.IPv6Address`` with at least 3 hex groups, so
  "a[::2]", "std::vector", "12:30:45" and MAC addresses stay.
* Phones are international ("+44 20 7946 0958"), bracketed area code ("(555) 123-4567") or the North American
  3-3-4 form with "-" or "." ("555-123-4567"), with 7 to 15 digits (E.164). National numbers written without
  any of these shapes ("020 7946 0958") are not recognised.
"""

import ipaddress
import re
from typing import NamedTuple

_EMAIL_RE = re.compile(r"(?<![\w.+%-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}(?![\w-])")
# Not glued to letters, digits or further dots: "1.2.3.4.5" and "v10.2.0.1" are versions.
_IPV4_RE = re.compile(r"(?<![\w.])\d{1,3}(?:\.\d{1,3}){3}(?!\w|\.\d)")
_VERSION_CONTEXT_RE = re.compile(
    r"(?i)(?:\b(?:v|ver|version|versions|release|rel|build|rev|revision|update|firmware|kernel|python)|版本|版)"
    r"\W{0,3}$"
)
_VERSION_WINDOW = 16
# Hex groups with colons, optionally ending in a dotted quad ("::ffff:192.0.2.1").
_IPV6_RE = re.compile(
    r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}(?:\d{1,3}(?:\.\d{1,3}){3}|[0-9A-Fa-f]{0,4})(?![\w:]|\.\d)"
)
_PHONE_RE = re.compile(
    r"(?<![\w+])(?<!\d[-.])(?:"
    r"\+\d{1,3}(?:[ -]?\(?\d{1,4}\)?){2,5}"
    r"|\(\d{2,4}\)[ ]?\d{3,4}[ -]\d{3,4}"
    r"|\d{3}([-.])\d{3}\1\d{4}"
    r")(?!\w|[-.]\d)"
)
_DIGIT_RE = re.compile(r"\d")
# Necessary conditions for a match, each starting with a literal so the regex engine scans for it quickly; the full
# patterns (which start with a character class and a look-behind) run only on texts that pass.
_IPV6_GATE = re.compile(r":[0-9A-Fa-f]{0,4}:")
_IPV4_GATE = re.compile(r"\.\d{1,3}\.\d{1,3}\.\d")
_PHONE_GATES = (re.compile(r"\+\d"), re.compile(r"\(\d"), re.compile(r"-\d{3}-\d{4}"), re.compile(r"\.\d{3}\.\d{4}"))


class PiiCounts(NamedTuple):
    """Replacements made in one document, per kind."""

    email: int = 0
    ip: int = 0
    phone: int = 0

    @property
    def total(self) -> int:
        return self.email + self.ip + self.phone


def _ipv4(m: re.Match[str]) -> str:
    text = m.group(0)
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return text
    if _VERSION_CONTEXT_RE.search(m.string, max(0, m.start() - _VERSION_WINDOW), m.start()):
        return text
    return "<IP>"


def _ipv6(m: re.Match[str]) -> str:
    text = m.group(0)
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return text
    # "1::2" in code is a slice, not an address: ask for a few groups (a trailing dotted quad holds two).
    groups = sum(2 if "." in g else 1 for g in text.split(":") if g)
    return "<IP>" if groups >= 3 else text


def _phone(m: re.Match[str]) -> str:
    digits = len(_DIGIT_RE.findall(m.group(0)))
    return "<PHONE>" if 7 <= digits <= 15 else m.group(0)  # E.164 allows at most 15 digits


def _sub_counted(pattern: re.Pattern[str], repl, text: str) -> tuple[str, int]:
    """``pattern.sub`` that counts only matches actually changed (callbacks may keep a match)."""
    if isinstance(repl, str):
        return pattern.subn(repl, text)
    changed = 0

    def wrapped(m: re.Match[str]) -> str:
        nonlocal changed
        out = repl(m)
        changed += out != m.group(0)
        return out

    return pattern.sub(wrapped, text), changed


def redact_counts(text: str) -> tuple[str, PiiCounts]:
    """Replace e-mails, IP addresses and phone numbers by placeholders; returns (text, replacements per kind).

    E-mails go first (their domains may look like addresses), then IPv6, IPv4 and phones; placeholders hold no
    digits, so a replaced span is never matched twice.
    """
    email = ip6 = ip4 = phone = 0
    if "@" in text:
        text, email = _sub_counted(_EMAIL_RE, "<EMAIL>", text)
    if _IPV6_GATE.search(text):
        text, ip6 = _sub_counted(_IPV6_RE, _ipv6, text)
    if _IPV4_GATE.search(text):
        text, ip4 = _sub_counted(_IPV4_RE, _ipv4, text)
    if any(gate.search(text) for gate in _PHONE_GATES):
        text, phone = _sub_counted(_PHONE_RE, _phone, text)
    return text, PiiCounts(email=email, ip=ip6 + ip4, phone=phone)


def redact(text: str) -> tuple[str, int]:
    """Replace e-mails, IP addresses and phone numbers by placeholders; returns (text, replacements made)."""
    text, counts = redact_counts(text)
    return text, counts.total
