"""Filter audit (docs/methods.md §7 (TinyStories filter audit)): labelled junk injected into a source, the corpus build run on it, what it caught."""
