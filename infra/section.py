"""Base class of every config section: strict (unknown keys rejected) and frozen once built."""

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A validated, immutable config section.

    Unknown keys raise at load time (``extra="forbid"``), so a typo never silently falls back to a default.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
