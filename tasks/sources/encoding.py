"""Decode raw HTML bytes into text, and say how the character encoding was decided.

Order (the WHATWG HTML "determining the character encoding" steps, with UTF-8 moved ahead of declarations):

1. Byte order mark (UTF-8, UTF-16 LE/BE, UTF-32 LE/BE) → ``"bom"``.
2. UTF-8 → ``"utf8"``, even when the page declares another charset, if the bytes are strict UTF-8 with
   non-ASCII bytes, or if valid multi-byte UTF-8 characters outnumber invalid sequences (a UTF-8 page with a
   few stray bytes; those become U+FFFD). Pages that declare latin-1/windows-1252 but are written in UTF-8 are
   common in web crawls, while text in a single-byte legacy encoding almost never forms valid multi-byte UTF-8
   sequences (they need a lead byte 0xC2-0xF4 followed by 0x80-0xBF bytes, i.e. mojibake such as "Ã©").
3. Declared charset: the HTTP ``Content-Type`` header (e.g. from a WARC record), then ``<meta charset=...>`` or
   ``<meta http-equiv="Content-Type" content="...; charset=...">`` in the first 4 KiB → ``"declared"``, used
   when the bytes decode with it without error. Labels are mapped as browsers do (WHATWG Encoding Standard,
   "Names and labels": ``iso-8859-1`` and ``ascii`` mean windows-1252, ``gb2312`` means GB18030, ...), and only
   the Standard's ASCII-compatible encodings count: other labels (``utf-16`` without a BOM, ``utf-7``, Python's
   ``hex`` or ``rot13``) are ignored. Pure-ASCII pages take their declared charset too (7-bit ``iso-2022-jp``).
4. Detection with charset-normalizer, its best candidate among those encodings → ``"detected"``.
5. Nothing fits: the declared charset, else windows-1252 (the WHATWG default for unlabelled pages in most
   locales; every byte but five decodes, so bytes are kept rather than replaced), undecodable bytes replaced →
   ``"declared"`` / ``"fallback"``.

Damage is recorded, not hidden: every undecodable byte sequence and every lone surrogate becomes U+FFFD and is
counted in ``num_replaced``. NUL characters are stripped, not rejected (they are never text, HTML parsers stop
at them, and stray NULs occur in otherwise good pages), and counted in ``num_nul_removed``; without a BOM the
NUL bytes are removed before decoding, since only ASCII-compatible encodings are used then.

Rejected instead of decoded (``read.binary``): more than 5% of the decoded characters (NUL excluded) are control
characters other than whitespace, or undecodable. Text in the right encoding has next to none, while
compressed or random bytes (images, PDFs, archives named ``.html``) give about 10% C0 controls (26 of 256 byte
values) in any single-byte codec and far more undecodable sequences in multi-byte ones; 5% sits between.
"""

import codecs
import re
from dataclasses import dataclass, replace
from typing import NamedTuple

import charset_normalizer

# The WHATWG HTML prescan reads 1,024 bytes; pages with long <head> scripts put <meta> later, so look further.
META_SCAN_BYTES = 4096
MAX_ODD_SHARE = 0.05  # module docstring: between ~0 (text) and ~0.10 (binary bytes)

_BOMS = [  # UTF-32 LE starts with the UTF-16 LE BOM, so it is tried first
    (codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"),
]
_META_CHARSET_RE = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
_HEADER_CHARSET_RE = re.compile(r"""charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
_CONTROL_RE = re.compile("[\x01-\x08\x0e-\x1f\x7f-\x9f]")  # C0/C1 controls except NUL and \t\n\v\f\r
# WHATWG Encoding Standard labels whose browser meaning differs from Python's codec of the same name.
_WHATWG_LABELS = {
    **dict.fromkeys(["ascii", "us-ascii", "iso-8859-1", "iso8859-1", "iso_8859-1", "latin1", "latin-1", "l1",
                     "cp819", "ibm819", "iso-ir-100", "csisolatin1", "x-cp1252"], "cp1252"),
    **dict.fromkeys(["iso-8859-9", "iso8859-9", "iso_8859-9", "latin5", "l5"], "cp1254"),
    **dict.fromkeys(["iso-8859-11", "tis-620"], "cp874"),
    **dict.fromkeys(["gb2312", "gbk", "x-gbk", "chinese", "csgb2312", "iso-ir-58"], "gb18030"),
    **dict.fromkeys(["big5", "cn-big5", "x-x-big5", "csbig5"], "big5hkscs"),
    **dict.fromkeys(["euc-kr", "ks_c_5601-1987", "korean", "windows-949"], "cp949"),
    **dict.fromkeys(["shift_jis", "shift-jis", "sjis", "ms_kanji", "x-sjis", "windows-31j", "csshiftjis"], "cp932"),
}
# The WHATWG Encoding Standard's ASCII-compatible encodings, as Python codec names.
WEB_CODECS = frozenset(codecs.lookup(label).name for label in [
    "utf-8", "ibm866", "iso-8859-2", "iso-8859-3", "iso-8859-4", "iso-8859-5", "iso-8859-6", "iso-8859-7",
    "iso-8859-8", "iso-8859-10", "iso-8859-13", "iso-8859-14", "iso-8859-15", "iso-8859-16", "koi8-r", "koi8-u",
    "macintosh", "cp874", "cp1250", "cp1251", "cp1252", "cp1253", "cp1254", "cp1255", "cp1256", "cp1257", "cp1258",
    "mac-cyrillic", "gb18030", "big5hkscs", "euc-jp", "iso-2022-jp", "cp932", "cp949",
])
DEFAULT_CODEC = "cp1252"
_MARK = "pretrain.lone_surrogate"
# Undecodable spans become one lone surrogate each (as "replace" makes one U+FFFD each); decoders never emit
# surrogates themselves, so ``scrub`` can count the damage and turn it into U+FFFD in one pass.
codecs.register_error(_MARK, lambda e: ("\ud800", e.end))


@dataclass(frozen=True)
class Decoded:
    """Text of one document and how it was obtained.

    ``encoding``: Python codec name used (``"utf-8"``, ``"cp1252"``, ...); ``decided_by``: ``"bom"``,
    ``"declared"``, ``"utf8"``, ``"detected"`` or ``"fallback"``; ``num_replaced``: characters replaced by U+FFFD
    (undecodable byte sequences and lone surrogates); ``num_nul_removed``: NUL characters stripped.
    """

    text: str
    encoding: str
    decided_by: str
    num_replaced: int = 0
    num_nul_removed: int = 0


class Rejected(NamedTuple):
    """Bytes that are not a text document: ``rule`` (``read.binary``) and a detail with the counts."""

    rule: str
    detail: str


def scrub(text: str, encoding: str = "utf-8", decided_by: str = "utf8") -> Decoded:
    """``text`` with NUL characters removed and lone surrogates (e.g. from a JSON ``"\\ud800"`` escape, which
    cannot be written as UTF-8) replaced by U+FFFD, with both counted."""
    num_nul = text.count("\x00")
    if num_nul:
        text = text.replace("\x00", "")
    text, num_replaced = _SURROGATE_RE.subn("\ufffd", text)
    return Decoded(text, encoding, decided_by, num_replaced, num_nul)


def decode_html(raw: bytes, http_content_type: str | None = None) -> Decoded | Rejected:
    """Decode an HTML page (module docstring: BOM → UTF-8 → declared → detected → fallback).

    ``http_content_type`` is the HTTP ``Content-Type`` header value when the page came with one (WARC response
    records); its charset outranks the page's ``<meta>``. Never raises on any input bytes.
    """
    for bom, codec in _BOMS:
        if raw.startswith(bom):
            return _checked(raw[len(bom):].decode(codec, errors=_MARK), codec, "bom")
    # Without a BOM only ASCII-compatible encodings are used (browsers do not sniff UTF-16 either), and in those
    # a NUL byte is always a NUL character: removing the bytes first keeps them from confusing detection.
    num_nul = raw.count(b"\x00")
    raw = raw.replace(b"\x00", b"") if num_nul else raw
    declared = _declared(raw, http_content_type)
    as_utf8 = raw.decode("utf-8", errors=_MARK)
    if raw.isascii():  # the declaration decides: 7-bit iso-2022-jp differs from ASCII
        return _checked(as_utf8 if declared is None else raw.decode(declared, errors=_MARK), declared or "utf-8",
                        "utf8" if declared is None else "declared", num_nul)
    num_bad = as_utf8.count("\ud800")
    num_good = len(as_utf8) - len(as_utf8.encode("ascii", errors="ignore")) - num_bad  # valid non-ASCII chars
    if num_bad < num_good:  # strict UTF-8 (num_bad 0) or mostly UTF-8
        return _checked(as_utf8, "utf-8", "utf8", num_nul)
    if declared is not None:
        try:
            return _checked(raw.decode(declared), declared, "declared", num_nul)
        except UnicodeDecodeError:
            pass  # a wrong declaration: detection below, the declaration as the last resort
    detected = next((c for c in (_python_codec(m.encoding) for m in charset_normalizer.from_bytes(raw)) if c), None)
    if detected is not None:
        return _checked(raw.decode(detected, errors=_MARK), detected, "detected", num_nul)
    codec = declared or DEFAULT_CODEC
    return _checked(raw.decode(codec, errors=_MARK), codec, "declared" if declared else "fallback", num_nul)


def _checked(text: str, codec: str, decided_by: str, num_nul: int = 0) -> Decoded | Rejected:
    """``scrub`` the decoded text (marks of undecodable spans → U+FFFD, counted) and reject binary content;
    ``num_nul``: NUL bytes already removed before decoding."""
    out = scrub(text, codec, decided_by)
    out = replace(out, num_nul_removed=out.num_nul_removed + num_nul)
    odd = out.num_replaced + len(_CONTROL_RE.findall(out.text))
    if odd > MAX_ODD_SHARE * max(1, len(out.text)):
        return Rejected("read.binary", f"{odd:,} of {len(out.text):,} characters are control characters or "
                                       f"undecodable as {codec} ({decided_by}); more than {MAX_ODD_SHARE:.0%} is "
                                       "not text")
    return out


def _declared(raw: bytes, http_content_type: str | None) -> str | None:
    """The codec the HTTP header, else the first ``<meta>`` charset, names; None when absent or not usable."""
    m = _HEADER_CHARSET_RE.search(http_content_type or "")
    codec = _python_codec(m.group(1)) if m else None
    if codec is None:
        m = _META_CHARSET_RE.search(raw[:META_SCAN_BYTES])
        codec = _python_codec(m.group(1).decode("ascii")) if m else None
    return codec


def _python_codec(label: str) -> str | None:
    """Python codec name of a charset label, browser meanings first; None unless it is in ``WEB_CODECS``."""
    label = label.strip().strip("\"'").lower()
    try:
        name = codecs.lookup(_WHATWG_LABELS.get(label, label)).name
    except LookupError:
        return None
    return name if name in WEB_CODECS else None
