"""Unicode repair (``tasks.corpus.extract.repair``) follows one rule for every document: ftfy with the corpus's
settings, whether or not the text holds a non-ASCII character."""

import ftfy
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.corpus.extract import _FTFY, repair


def test_control_characters_and_terminal_escapes_go_from_a_pure_ascii_document():
    text, fixes = repair("Bell\x07 here, \x1b[1mbold\x1b[0m and a form\x0bfeed.")
    assert text == "Bell here, bold and a formfeed."
    assert fixes == "apply:remove_terminal_escapes,apply:remove_control_chars"


def test_an_ascii_and_a_non_ascii_document_lose_the_same_control_characters():
    ascii_text, _ = repair("tea\x07 at \x1bfour")
    accented, _ = repair("thé\x07 at \x1bfour")
    assert (ascii_text, accented) == ("tea at four", "thé at four")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=40))
def test_every_ascii_text_is_repaired_as_ftfy_repairs_it(text):
    assert repair(text)[0] == ftfy.fix_and_explain(text, config=_FTFY).text
