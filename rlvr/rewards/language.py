"""R1's language-consistency reward: the share of the reasoning written in the target language.

DeepSeek-R1 (sec. 2.3.2) computes it "as the proportion of target language words in the CoT".
We approximate "language" by Unicode *script*, which needs no model and no word lists:
a maximal run of letters of an alphabetic script (Latin, Cyrillic, Greek, Arabic, ...) counts as
one word, and each CJK ideograph / kana / hangul syllable counts as one word (those scripts do
not separate words by spaces). Digits, math symbols and punctuation are ignored. Departure from
the paper: languages sharing a script (English vs French) are not told apart.
"""

from __future__ import annotations

import unicodedata

# ISO 639-1 language code -> the scripts its words are written in.
LANGUAGE_SCRIPTS: dict[str, frozenset[str]] = {
    "en": frozenset({"LATIN"}),
    "fr": frozenset({"LATIN"}),
    "de": frozenset({"LATIN"}),
    "es": frozenset({"LATIN"}),
    "it": frozenset({"LATIN"}),
    "pt": frozenset({"LATIN"}),
    "zh": frozenset({"CJK"}),
    "ja": frozenset({"CJK", "HIRAGANA", "KATAKANA"}),
    "ko": frozenset({"HANGUL"}),
    "ru": frozenset({"CYRILLIC"}),
    "uk": frozenset({"CYRILLIC"}),
    "el": frozenset({"GREEK"}),
    "ar": frozenset({"ARABIC"}),
    "he": frozenset({"HEBREW"}),
    "hi": frozenset({"DEVANAGARI"}),
    "th": frozenset({"THAI"}),
}
# Scripts whose characters each count as one word.
_PER_CHAR_SCRIPTS = frozenset({"CJK", "HIRAGANA", "KATAKANA", "HANGUL", "THAI"})
_script_cache: dict[str, str | None] = {}


def script_of(ch: str) -> str | None:
    """Script name of a letter ("LATIN", "CJK", ...), None for non-letters."""
    if ch.isascii():
        return "LATIN" if ch.isalpha() else None
    got = _script_cache.get(ch)
    if got is not None or ch in _script_cache:
        return got
    script = None
    if ch.isalpha():
        name = unicodedata.name(ch, "")
        script = name.split(" ", 1)[0] if name else None
    if len(_script_cache) < 65_536:
        _script_cache[ch] = script
    return script


def script_words(text: str) -> list[str]:
    """The script of each word of `text`, in order (see the module docstring for "word")."""
    words: list[str] = []
    current: str | None = None  # script of the alphabetic word being read
    for ch in text:
        script = script_of(ch)
        if script is None:
            current = None
            continue
        if script in _PER_CHAR_SCRIPTS:
            words.append(script)
            current = None
        elif script != current:
            words.append(script)
            current = script
    return words


def language_share(text: str, language: str = "en") -> float:
    """Fraction of words of `text` written in a script of `language` (0.0 when there are no
    words: an empty or all-math reasoning earns nothing, so it cannot be used to game the term).
    Unknown language code -> KeyError listing the known ones."""
    try:
        targets = LANGUAGE_SCRIPTS[language]
    except KeyError:
        raise KeyError(f"unknown language {language!r}; known: {', '.join(sorted(LANGUAGE_SCRIPTS))}") from None
    words = script_words(text)
    if not words:
        return 0.0
    return sum(1 for w in words if w in targets) / len(words)
