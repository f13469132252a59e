"""Answer extraction from model responses: linear time, capped input, never raises.

Every extractor returns the answer text or None ("no answer found"); the reward functions turn
None into `Status.UNPARSABLE`. Model output is hostile input, so each extractor first cuts the
response to `MAX_RESPONSE_CHARS` (keeping the *tail*, where final answers live) and then uses
only `str.find`/`rfind`, bounded scans and regexes without nested quantifiers.

r1_zero format policy (see docs/verifier.md):
  * the format is satisfied when the response contains the exact separator `</think> <answer>`
    (one space, as the r1_zero prompt spells it) and a later `</answer>`. This is the CS336
    assignment's `r1_zero_reward_fn` rule, so format rates are comparable with that reference.
  * the answer is the text between the LAST `<answer>` that has a `</answer>` after it and the
    first `</answer>` after it, stripped of surrounding whitespace ("last answer block wins"); a
    stray extra `</answer>` after a complete block does not void it.
  * text after that `</answer>` is ignored. Departure from CS336, which keeps trailing text as
    part of the answer (it only deletes the closing tag): a model that writes
    `<answer>5</answer> because ...` is graded on `5`, not on `5 because ...`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_RESPONSE_CHARS = 65_536  # longer responses are cut to their last 64 Ki characters
MAX_ANSWER_CHARS = 2_000  # an extracted answer longer than this is treated as no answer
_MAX_BOXED_TRIES = 8  # unbalanced \boxed{ occurrences skipped before giving up (keeps it linear)

THINK_CLOSE = "</think>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
R1_SEPARATOR = "</think> <answer>"


def _cap(text: str) -> str:
    if not isinstance(text, str):
        return ""
    return text if len(text) <= MAX_RESPONSE_CHARS else text[-MAX_RESPONSE_CHARS:]


def _ok(answer: str | None) -> str | None:
    if answer is None:
        return None
    answer = answer.strip()
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return None
    return answer


@dataclass(frozen=True)
class R1Parse:
    """Result of parsing an r1_zero response."""

    format_ok: bool  # `</think> <answer>` and a later `</answer>` are present
    answer: str | None  # text of the last complete answer block, None if absent/empty
    reasoning: str  # text before the first `</think>` (the prompt opens `<think>`)


def parse_r1_zero(response: str) -> R1Parse:
    """Split an r1_zero response into format flag, answer block and reasoning (policy above)."""
    text = _cap(response)
    close = text.rfind(ANSWER_CLOSE)
    sep = text.find(R1_SEPARATOR)
    format_ok = sep >= 0 and close > sep
    think_end = text.find(THINK_CLOSE)
    reasoning = text[:think_end] if think_end >= 0 else text
    if reasoning.lstrip().startswith("<think>"):
        reasoning = reasoning.lstrip()[len("<think>") :]
    answer = None
    if close >= 0:
        open_ = text.rfind(ANSWER_OPEN, 0, close)
        if open_ >= 0:
            # the block ends at the first </answer> after its opening tag: a stray extra
            # "</answer>" later ("<answer>5</answer></answer>") is not part of the answer
            first_close = text.find(ANSWER_CLOSE, open_ + len(ANSWER_OPEN))
            answer = _ok(text[open_ + len(ANSWER_OPEN) : first_close])
    return R1Parse(format_ok=format_ok, answer=answer, reasoning=reasoning)


def answer_block(response: str) -> str | None:
    """Text of the last complete `<answer>...</answer>` block, tags not required elsewhere."""
    return parse_r1_zero(response).answer


def _matching_brace(text: str, open_idx: int) -> int:
    """Index of the `}` closing the `{` at open_idx, or -1. Escaped braces `\\{` `\\}` count as
    ordinary characters. One pass, O(len)."""
    depth = 0
    i = open_idx
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def last_boxed(response: str) -> str | None:
    """Content of the last `\\boxed{...}` or `\\fbox{...}` (nested braces allowed).

    `\\boxed 5` (no braces) yields `5`. An unclosed last box (`\\boxed{3` at the end of a
    truncated response) yields None: it does not fall back to an earlier box, which the model
    may have revised. None when there is no box."""
    text = _cap(response)
    end = len(text)
    for _ in range(_MAX_BOXED_TRIES):
        i_box = text.rfind("\\boxed", 0, end)
        i_fbox = text.rfind("\\fbox", 0, end)
        idx = max(i_box, i_fbox)
        if idx < 0:
            return None
        start = idx + (len("\\boxed") if idx == i_box else len("\\fbox"))
        j = start
        while j < len(text) and text[j] == " ":
            j += 1
        if j < len(text) and text[j] == "{":
            close = _matching_brace(text, j)
            return _ok(text[j + 1 : close]) if close >= 0 else None
        elif j > start and j < len(text):
            # `\boxed 5`: the token up to whitespace or `$`.
            m = re.match(r"[^\s$]+", text[j : j + MAX_ANSWER_CHARS])
            if m:
                return _ok(m.group(0))
        end = idx
    return None


# After `####`: a number (currency sign, sign, thousands separators, decimals with or without a
# leading digit, a fraction, percent), optionally followed by up to three unit words.
_HASH_NUMBER = re.compile(
    r"^(?:\\?\$\s*+)?+[-+\u2212]?+(?:\d{1,3}(?:,\d{3})++(?:\.\d++)?+|\d++(?:\.\d++)?+|\.\d++)"
    r"(?:\s*+/\s*+\d++)?+(?:\s*+%)?+(?:\s++[A-Za-z]{1,20}){0,3}\s*+\.?+$"
)


def gsm8k_hash(response: str) -> str | None:
    """Text after the last `####` up to the end of that line (GSM8K reference format), when it
    is a number (optionally with a currency sign, percent or unit words); text that is not a
    number ("#### I think it is five") yields None."""
    text = _cap(response)
    idx = text.rfind("####")
    if idx < 0:
        return None
    rest = text[idx + 4 :]
    nl = rest.find("\n")
    got = _ok(rest if nl < 0 else rest[:nl])
    if got is None or _HASH_NUMBER.match(got) is None:
        return None
    return got


_ANSWER_IS = re.compile(r"answer\s*+(?:is|:)\s*+:?+", re.IGNORECASE)


def answer_is(response: str) -> str | None:
    """Text after the last "the answer is" / "answer:" up to the end of that line, with a final
    sentence period removed. E.g. "So the answer is $42$." -> "$42$"."""
    text = _cap(response)
    last = None
    for m in _ANSWER_IS.finditer(text):
        last = m
    if last is None:
        return None
    rest = text[last.end() :]
    nl = rest.find("\n")
    rest = rest if nl < 0 else rest[:nl]
    rest = rest.strip()
    # A sentence-ending period (not a decimal point) ends the answer.
    m = re.search(r"\.(?:\s|$)", rest)
    if m:
        rest = rest[: m.start()]
    return _ok(rest)


# A number token: optional sign, digits with optional thousands separators (`,` or a space
# followed by exactly three digits), optional decimals, optional exponent. No nested quantifiers
# over the same characters, so the regex engine stays linear.
# Atomic: a number glued to a unit ("1,000.99m", "5cm") is read whole, never cut back to a
# shorter prefix ("1,000") to satisfy a boundary.
_NUMBER = re.compile(
    r"(?<![\w.])(?>-?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?<!\d)\.\d+)(?:[eE][-+]?\d+)?(?:/\d+)?)(?!\d|[.,]\d)"
)


def last_number(response: str) -> str | None:
    """The last number in the response ("-1,234.5", "3/4", "6.02e23"); None if there is none."""
    text = _cap(response)
    last = None
    for m in _NUMBER.finditer(text):
        last = m
    return None if last is None else last.group(0)


_LETTER_PATTERNS = (
    # "answer is (B)", "Answer: B"
    # possessive quantifiers (*+, ?+): adjacent optional blanks must not backtrack (ReDoS)
    re.compile(r"answer\s*+(?:is)?+\s*+:?+\s*+\(?+\s*+([A-Z])\s*+\)?+(?![A-Za-z])", re.IGNORECASE),
    # "(B)" anywhere
    re.compile(r"\(([A-Z])\)"),
    # "B)" or "B." at the start of a line
    re.compile(r"(?m)^\s*+([A-Z])[).:](?:\s|$)"),
    # a lone capital letter token; "I" and "A" followed by a lower-case word are English
    re.compile(r"(?<![A-Za-z])(?![AI]\s+[a-z])([A-Z])(?![A-Za-z])"),
)


def choice_letter(response: str, letters: str = "ABCDEFGHIJ") -> str | None:
    """The multiple-choice letter a response commits to, upper case, or None.

    Tried in order (the first pattern that matches wins; within a pattern the LAST match wins):
    an answer block or `\\boxed{}` content if present, "answer is (B)", "(B)", a line starting
    "B)", a lone capital letter. Only letters in `letters` count."""
    text = _cap(response)
    for inner in (answer_block(text), last_boxed(text)):
        if inner is not None:
            text = inner
            break
    for pat in _LETTER_PATTERNS:
        last = None
        for m in pat.finditer(text):
            if m.group(1).upper() in letters:
                last = m
        if last is not None:
            return last.group(1).upper()
    return None


def final_answer(response: str) -> str | None:
    """Generic extraction for free-form math responses, most explicit marker first:
    answer block > `\\boxed{}` > `####` > "the answer is" > last number (only when the response
    has none of those markers)."""
    for fn in (answer_block, last_boxed, gsm8k_hash, answer_is):
        ans = fn(response)
        if ans is not None:
            # An answer block that itself contains a box is graded on the box.
            if fn is answer_block and ("\\boxed" in ans or "\\fbox" in ans):
                return last_boxed(ans)
            return ans
    # A marker that yielded nothing usable (unbalanced, too long) is a malformed answer: no
    # falling back to a number picked out of it.
    tail = _cap(response)
    if any(m in tail for m in (ANSWER_OPEN, "\\boxed", "\\fbox", "####")):
        return None
    return last_number(response)


def reference_answer(reference: str) -> str:
    """The gold answer inside a reference string: after `####` if present (GSM8K solutions),
    else the last `\\boxed{}` if present (MATH solutions), else the whole stripped string."""
    if "####" in reference:
        got = gsm8k_hash(reference)
        if got is not None:
            return got
    if "\\boxed" in reference or "\\fbox" in reference:
        got = last_boxed(reference)
        if got is not None:
            return got
    return reference.strip()


EXTRACTORS = {
    "r1_zero": answer_block,
    "boxed": last_boxed,
    "gsm8k": gsm8k_hash,
    "answer_is": answer_is,
    "last_number": last_number,
    "choice": choice_letter,
    "final": final_answer,
}


def get_extractor(name: str):
    """Extractor by name; unknown name -> KeyError listing the known ones."""
    try:
        return EXTRACTORS[name]
    except KeyError:
        raise KeyError(f"unknown extractor {name!r}; known: {', '.join(sorted(EXTRACTORS))}") from None
