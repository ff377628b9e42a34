"""PII placeholders (docs/methods.md §7): e-mail, phone, IPv4/IPv6 replaced; versions, decimals, IDs and punctuation kept."""

import pytest

from tasks.corpus.pii import PiiCounts, redact, redact_counts


@pytest.mark.parametrize("text,expected,count", [
    ("Write to jane.roe+lists@mail.example.org.", "Write to <EMAIL>.", 1),
    ('"contact: a.b@example.org",', '"contact: <EMAIL>",', 1),
    ("(mail: <ops@example.com>)", "(mail: <<EMAIL>>)", 1),
    ("Call +44 20 7946 0958, or (555) 123-4567!", "Call <PHONE>, or <PHONE>!", 2),
    ("Office: 555-123-4567.", "Office: <PHONE>.", 1),
    ("US: +1 (555) 123-4567; FR: +33 1 23 45 67 89.", "US: <PHONE>; FR: <PHONE>.", 2),
    ("Gateway (192.168.10.1) is down.", "Gateway (<IP>) is down.", 1),
    ("Server 10.2.0.1, port 22", "Server <IP>, port 22", 1),
    ("Listen on 10.0.0.1:8080.", "Listen on <IP>:8080.", 1),
    ("Ping 2001:db8:85a3::8a2e:370:7334; done", "Ping <IP>; done", 1),
    ("Mapped ::ffff:192.0.2.1 here", "Mapped <IP> here", 1),
    ("URL [2001:db8::1]:443", "URL [<IP>]:443", 1),
])
def test_pii_is_replaced(text, expected, count):
    assert redact(text) == (expected, count)


@pytest.mark.parametrize("text", [
    "Upgrade to version 10.2.0.1 before Friday.",
    "Upgrade to version 1.10.0.0 before Friday.",
    "Version: 1.10.0.0 (build 10.2.0.1)",
    "Firmware v10.2.0.1 and release 4.1.0.3 are out.",
    "Python 3.11.2 ships 1.2.3.4.5 and pi = 3.14159; 1234.5678 units; 2023-02-08.",
    "The weight is 0.250750683890174 and the loss 0.0001.",
    "Slice a[::2] and call std::vector at 12:30:45.",
    "No IP here: 999.1.1.1 is not an address, nor 010.001.002.003.",
    "NIC 00:1a:2b:3c:4d:5e, order 4829174650192, ISBN 978-0-306-40615-7.",
    "Request 123e4567-e89b-12d3-a456-426614174000 failed.",
    "Serial 555-123-4567-89 and 555.123.4567.8 are part numbers.",
    "软件版本 1.0.0.1 已发布。",
])
def test_versions_decimals_ids_and_code_are_untouched(text):
    assert redact(text) == (text, 0)


def test_version_word_must_stand_alone():
    assert redact("preversion 10.2.0.1")[0] == "preversion <IP>"


def test_counts_per_kind():
    text = "a@b.org, c@d.net, 8.8.8.8, fe80::1ff:fe23:4567:890a, +44 20 7946 0958"
    redacted, counts = redact_counts(text)
    assert redacted == "<EMAIL>, <EMAIL>, <IP>, <IP>, <PHONE>"
    assert counts == PiiCounts(email=2, ip=2, phone=1) and counts.total == 5
    assert redact_counts("nothing here") == ("nothing here", PiiCounts())
