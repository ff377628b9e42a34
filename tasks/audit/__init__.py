"""Filter audit (SPEC §7 Lab 1): labelled junk injected into a source, the corpus build run on it, what it caught."""
