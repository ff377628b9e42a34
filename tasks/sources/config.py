"""Config section of one corpus source: where its files come from and how to read them.

A source is either a Debian package fetched by name (``kind="deb"``, see ``tasks.sources.deb``) or files already
on disk (``kind="local"``). The TOML table key becomes ``name``; it prefixes every document id.
"""

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from infra.errors import ConfigError
from infra.section import NOT_IN_KEY, Section

_NAME_RE = re.compile(r"^[a-z0-9_]+$")
# Debian Policy §5.6.1: lower case letters, digits, + - . ; at least two characters; starts alphanumeric.
_DEB_PACKAGE_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
# Debian Policy §5.6.12: [epoch:]upstream_version[-debian_revision]; the upstream part starts with a digit.
_DEB_VERSION_RE = re.compile(r"^(?:[0-9]+:)?[0-9][A-Za-z0-9.+~-]*$")


def check_package_name(package: str) -> str:
    """Return ``package`` unchanged if it is a valid Debian package name (Debian Policy §5.6.1).

    Raises:
        ConfigError: the name has upper case letters, spaces, shell characters or is shorter than 2 characters.
    """
    if not _DEB_PACKAGE_RE.match(package):
        raise ConfigError(
            f"package={package!r} is not a Debian package name: use lower-case letters, digits and '+.-', "
            "at least 2 characters, starting with a letter or digit (e.g. 'debian-handbook')"
        )
    return package


def check_version(version: str) -> str:
    """Return ``version`` unchanged if it is a Debian package version (Debian Policy §5.6.12).

    Raises:
        ConfigError: not ``[epoch:]upstream_version[-debian_revision]`` (epoch digits, upstream starting with a
            digit and made of letters, digits and ``.+~-``, a revision of letters, digits and ``.+~``).
    """
    # The revision is what follows the last hyphen, so a trailing hyphen leaves it empty.
    if not _DEB_VERSION_RE.match(version) or version.endswith("-"):
        raise ConfigError(
            f"version={version!r} is not a Debian package version: use [epoch:]upstream[-revision] with letters, "
            "digits and '.+~-', the upstream part starting with a digit (e.g. '3.11.2-6+deb12u8' or '1:1.99.1-7.3')"
        )
    return version


class SourceConfig(Section):
    """One source of documents.

    Fields:
        name: source name, ``^[a-z0-9_]+$`` (the TOML table key); prefix of every ``doc_id``.
        kind: ``"deb"`` (fetched with apt-get) or ``"local"`` (files on disk).
        package: Debian package name; required for ``deb``, must be unset for ``local``.
        version: Debian package version to fetch (``deb`` only); unset: the candidate version of the apt package
            lists, resolved each time the key is computed, so a moved archive is a new key.
        include: glob patterns (``**`` allowed) or folders (every file under them); for ``deb`` relative to the
            unpacked package root, for ``local`` absolute or relative to the working directory. A ``local`` source
            reads the members of the archives it matches (.tar, .tar.gz/.tgz, .tar.xz, .tar.bz2, .zip) as files.
        format: how to split files into documents; ``auto`` picks by file extension (``warc`` for
            ``*.warc``/``*.warc.gz``, e.g. Common Crawl files).
        text_field: the text column/key for ``jsonl`` and ``parquet``.
        url_field: the column/key of each document's URL for ``jsonl`` and ``parquet`` ("" for none); it fills the
            documents' ``url``, which the corpus URL rules read. A value that is not a URL with a host
            (``tasks.sources.read.is_url``: ``"n/a"``, a number, ``mailto:...``) is read as no URL, counted per
            source as ``url_invalid`` in ``sources.json`` and logged with examples; null and blank values are no
            URL. A Parquet file without that column, or a source none of whose JSONL records has the key, is an
            error (``SourceError`` naming the source, the field and the keys the records have). WARC documents
            always take the record's target URI.
        language: language hint (ISO 639-1 like ``"en"``), used when text is too short to identify.
        role: ``general`` text or ``domain`` text (for continued pretraining).
        max_docs: keep only the first N documents in sorted path order (smoke configs); reading stops at the
            N-th document.
        max_file_bytes: the most bytes read into memory as one piece: a whole html, text or fortune file, one
            JSONL line, one WARC page body, one Parquet value (UTF-8 bytes; default 64 MiB). Larger ones are
            rejected (``read.too_large``); JSONL, Parquet and WARC files themselves are streamed, whatever their
            size.
        follow_symlinks: for ``local`` sources, whether a matched file whose real path lies outside the folder it
            was matched in (a symlink out of it, of the file or of a folder on the way) is read. Off by default: a
            link can bring in any file the process can read (a key, a credentials file), and a document once
            trained on cannot be taken back; such a file is one ``read.link_outside`` reject row naming the link
            and its target, and a warning. On, it is read, with the same warning. Links that stay inside the
            folder are read either way.
    """

    name: str
    kind: Literal["deb", "local"]
    package: str | None = None
    version: str | None = Field(default=None, json_schema_extra=NOT_IN_KEY)  # the key holds the resolved release
    include: list[str]
    format: Literal["auto", "html", "warc", "text", "fortune", "jsonl", "parquet"] = "auto"
    text_field: str = "text"
    url_field: str = ""
    language: str | None = None
    role: Literal["general", "domain"] = "general"
    max_docs: int | None = None
    max_file_bytes: int = 64 * 2**20
    follow_symlinks: bool = False

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ConfigError(f"source name={v!r} is invalid: use lower-case letters, digits and '_' (e.g. 'fortunes_zh')")
        return v

    @field_validator("language")
    @classmethod
    def _check_language(cls, v: str | None) -> str | None:
        from infra.languages import LID176_LABELS

        if v is not None and v not in LID176_LABELS:
            raise ConfigError(f"source language={v!r} is not a lid.176 label; use codes like 'en', 'zh', or omit it")
        return v

    @field_validator("package")
    @classmethod
    def _check_package(cls, v: str | None) -> str | None:
        return None if v is None else check_package_name(v)

    @field_validator("version")
    @classmethod
    def _check_version(cls, v: str | None) -> str | None:
        return None if v is None else check_version(v)

    @field_validator("include")
    @classmethod
    def _check_include(cls, v: list[str]) -> list[str]:
        if not v or any(not p.strip() for p in v):
            raise ConfigError(f"include={v!r} must list at least one non-empty glob pattern (e.g. ['usr/share/doc/x/*.html'])")
        return v

    @field_validator("max_docs")
    @classmethod
    def _check_max_docs(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ConfigError(f"max_docs={v} must be >= 1, or left unset to read every document")
        return v

    @field_validator("max_file_bytes")
    @classmethod
    def _check_max_file_bytes(cls, v: int) -> int:
        if v < 1:
            raise ConfigError(f"max_file_bytes={v} must be >= 1 (bytes; e.g. 67108864 for 64 MiB)")
        return v

    @model_validator(mode="after")
    def _check_kind(self) -> "SourceConfig":
        if self.kind == "deb" and self.package is None:
            raise ConfigError(f"source {self.name!r}: kind='deb' needs package='<debian package name>'")
        if self.kind == "local" and self.package is not None:
            raise ConfigError(f"source {self.name!r}: package={self.package!r} is only for kind='deb'; remove it")
        if self.kind != "local" and self.follow_symlinks:
            raise ConfigError(f"source {self.name!r}: follow_symlinks is only for kind='local'; remove it")
        if self.kind != "deb" and self.version is not None:
            raise ConfigError(f"source {self.name!r}: version={self.version!r} is only for kind='deb'; remove it")
        if self.url_field and self.format not in ("auto", "jsonl", "parquet"):
            raise ConfigError(f"source {self.name!r}: url_field={self.url_field!r} is read from jsonl and parquet "
                              f"files only, not format={self.format!r}; remove it")
        return self
