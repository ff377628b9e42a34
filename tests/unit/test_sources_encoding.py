"""HTML charset decisions (BOM, UTF-8, declared, detected, fallback), damage counts and binary rejection."""

import codecs
import random

import charset_normalizer
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.sources.encoding import Decoded, Rejected, decode_html, scrub

RU = "Привет! Это обычная страница о погоде, новостях и ценах на хлеб в нашем городе. " * 6
FR = "Le café de la place sert des crèmes brûlées à côté de l’église, été comme hiver."


def page(body: str, head: str = "") -> str:
    return f"<html><head>{head}</head><body><p>{body}</p></body></html>"


def decoded(raw: bytes, http: str | None = None) -> Decoded:
    out = decode_html(raw, http)
    assert isinstance(out, Decoded), out
    return out


@pytest.mark.parametrize("bom, codec", [(codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"),
                                        (codecs.BOM_UTF16_BE, "utf-16-be"), (codecs.BOM_UTF32_LE, "utf-32-le")])
def test_bom_wins_over_any_declaration(bom, codec):
    html = page(FR, '<meta charset="windows-1251">')
    out = decoded(bom + html.encode(codec))
    assert (out.text, out.encoding, out.decided_by) == (html, codec, "bom")


def test_meta_declarations_use_browser_label_meanings():
    # iso-8859-1 means windows-1252 in browsers (WHATWG): 0x93/0x94 are curly quotes, not C1 controls
    raw = page("“café”", '<meta charset="ISO-8859-1">').encode("cp1252")
    out = decoded(raw)
    assert "“café”" in out.text and (out.encoding, out.decided_by) == ("cp1252", "declared")
    http_equiv = '<meta http-equiv="Content-Type" content="text/html; charset=Shift_JIS">'
    out = decoded(page("日本語のページです。", http_equiv).encode("cp932"))
    assert "日本語のページです。" in out.text and out.decided_by == "declared"


def test_http_header_charset_outranks_meta():
    raw = page(RU, '<meta charset="iso-8859-1">').encode("cp1251")
    out = decoded(raw, "text/html; charset=windows-1251")
    assert RU in out.text and (out.encoding, out.decided_by) == ("cp1251", "declared")


def test_valid_utf8_wins_over_a_wrong_declaration():
    out = decoded(page(FR, '<meta charset="windows-1252">').encode("utf-8"), "text/html; charset=iso-8859-1")
    assert FR in out.text and (out.encoding, out.decided_by, out.num_replaced) == ("utf-8", "utf8", 0)


def test_mostly_utf8_keeps_utf8_and_counts_the_stray_bytes():
    raw = page(FR).encode("utf-8").replace(b"place", b"pl\xffce\xfe")
    out = decoded(raw, "text/html; charset=windows-1252")
    assert (out.decided_by, out.num_replaced) == ("utf8", 2) and "crèmes brûlées" in out.text
    assert "pl\ufffdce\ufffd" in out.text


def test_pure_ascii_takes_the_declared_7bit_charset():
    out = decoded(page("日本", "<meta charset=iso-2022-jp>").encode("iso-2022-jp"))
    assert "日本" in out.text and out.decided_by == "declared"
    assert decoded(b"<p>plain</p>").decided_by == "utf8"


def test_undeclared_or_wrongly_declared_legacy_text_is_detected():
    assert RU in decoded(page(RU).encode("cp1251")).text
    out = decoded(page(RU, '<meta charset="utf-8">').encode("cp1251"))  # the declaration does not decode
    assert RU in out.text and (out.encoding, out.decided_by) == ("cp1251", "detected")


@pytest.mark.parametrize("label", ["utf-7", "utf-16", "no-such-charset", "hex", "rot13", "unicode_escape",
                                   "punycode", "undefined"])
def test_labels_outside_the_web_encodings_are_ignored(label):
    out = decoded(page("a+b-c \\u00e9", f"<meta charset={label}>").encode("ascii"))
    assert "a+b-c \\u00e9" in out.text and out.encoding == "utf-8"
    out = decoded(page(RU, f"<meta charset={label}>").encode("cp1251"), f"text/html; charset={label}")
    assert RU in out.text and out.decided_by == "detected"


def test_undetectable_legacy_bytes_fall_back_to_windows_1252_without_losing_bytes(monkeypatch):
    monkeypatch.setattr(charset_normalizer, "from_bytes", lambda raw: [])  # detection finds nothing
    raw = "zażółć gęślą jaźń ".encode("iso-8859-2") * 3
    out = decoded(raw)
    assert (out.encoding, out.decided_by, out.num_replaced) == ("cp1252", "fallback", 0)
    assert out.text.encode("cp1252") == raw


def test_nul_bytes_are_stripped_and_counted_even_in_legacy_pages():
    out = decoded(page("Hello\x00 world\x00").encode("utf-8"))
    assert out.text == page("Hello world") and out.num_nul_removed == 2
    out = decoded(page(RU).encode("cp1251").replace(b"!", b"!\x00"))
    assert RU in out.text and out.num_nul_removed == 6 and out.decided_by == "detected"


def test_binary_bytes_are_rejected_whatever_the_declaration():
    rng = random.Random(0)
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(rng.randrange(256) for _ in range(4000))
    for raw, http in [(png, None), (b"<meta charset=latin1>" + png, None), (png, "text/html; charset=utf-8")]:
        out = decode_html(raw, http)
        assert isinstance(out, Rejected) and out.rule == "read.binary" and "not text" in out.detail


def test_empty_input_is_empty_text():
    assert decoded(b"") == Decoded("", "utf-8", "utf8", 0, 0)


def test_scrub_replaces_lone_surrogates_and_drops_nul():
    out = scrub("a\ud800b\x00c\udfff")
    assert (out.text, out.num_replaced, out.num_nul_removed) == ("a\ufffdbc\ufffd", 2, 1)
    assert out.text.encode("utf-8")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600), st.sampled_from([None, "text/html", "text/html; charset=shift_jis",
                                                   "text/html; charset=utf-16", "text/html; charset=bogus",
                                                   "text/html; charset=rot13", "text/html; charset=iso-2022-jp"]))
def test_any_bytes_decode_to_writable_text_or_a_reason(raw, http):
    out = decode_html(raw, http)
    if isinstance(out, Rejected):
        assert out.rule == "read.binary" and out.detail
    else:
        assert "\x00" not in out.text and out.text.encode("utf-8") is not None  # no lone surrogates left
        assert out.decided_by in {"bom", "declared", "utf8", "detected", "fallback"}
