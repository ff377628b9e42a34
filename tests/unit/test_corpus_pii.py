"""PII placeholders (SPEC §7): e-mail, phone, IPv4/IPv6 replaced; versions, decimals and punctuation kept."""

import pytest

from tasks.corpus.pii import redact


@pytest.mark.parametrize("text,expected,count", [
    ("Write to jane.roe+lists@mail.example.org.", "Write to <EMAIL>.", 1),
    ("Call +44 20 7946 0958, or (555) 123-4567!", "Call <PHONE>, or <PHONE>!", 2),
    ("Office: 555-123-4567.", "Office: <PHONE>.", 1),
    ("Gateway (192.168.10.1) is down.", "Gateway (<IP>) is down.", 1),
    ("Ping 2001:db8:85a3::8a2e:370:7334; done", "Ping <IP>; done", 1),
])
def test_pii_is_replaced(text, expected, count):
    assert redact(text) == (expected, count)


@pytest.mark.parametrize("text", [
    "Upgrade to version 10.2.0.1 before Friday.",
    "Firmware v10.2.0.1 and release 4.1.0.3 are out.",
    "Python 3.11.2 ships 1.2.3.4.5 and pi = 3.14159; 1234.5678 units; 2023-02-08.",
    "Slice a[::2] and call std::vector at 12:30:45.",
    "No IP here: 999.1.1.1 is not an address.",
])
def test_versions_decimals_and_code_are_untouched(text):
    assert redact(text) == (text, 0)
