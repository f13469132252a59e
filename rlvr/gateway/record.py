"""What the gateway records of an episode, and how its calls become trainable token sequences.

Torch-free and server-free: the trainer side (rlvr.envs.external) and adapters read these records without the
HTTP stack. One `CallRecord` per answered request holds the exact token ids the policy was conditioned on and
sampled, with the sampler's logprobs: the trainer trains on them, never on re-tokenized text.

`merge_calls` joins the calls of an episode into `Segment`s by the extension property (prime-rl calls it the
"exact prefix" invariant): call k+1 continues the current segment when its prompt ids start with the segment's
prompt ids + response ids so far. The ids in between (a tool result, the next user turn, the chat template's
glue) join the response with loss_mask False and logprob 0.0, then the call's completion with loss_mask True and
its logprobs. A call that does not extend the segment (the agent rewrote or trimmed its history, or its text did
not re-render to the same ids) starts a new Segment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class CallRecord:
    """One answered request: what the policy saw and sampled."""

    prompt_ids: list[int]  # (P,) the ids the generator was conditioned on
    completion_ids: list[int]  # (C,) the sampled ids (EOS / the stop string's tokens included)
    logprobs: list[float]  # (C,) the sampler's logprob of each completion id
    weight_version: int  # generator.weight_version when the call was sampled
    finish_reason: str  # "stop" | "length" | "tool_calls", as returned to the client
    text: str  # the completion text (special tokens skipped, cut at a stop string; tool-call markup kept)
    endpoint: str  # "chat" | "completions"
    # additions: the parsed tool calls as returned (OpenAI shape: id, type, function{name, arguments}) and the
    # call's index in its episode (the per-call seed is derived from it)
    tool_calls: list[dict] = field(default_factory=list)
    index: int = 0


@dataclass
class Segment:
    """One trainable sequence: prompt_ids, then response_ids of which loss_mask marks the sampled ones."""

    prompt_ids: list[int]  # (P,) the first call's prompt
    response_ids: list[int]  # (R,) completions and, between them, the ids the policy did not sample
    logprobs: list[float]  # (R,) the sampler's logprobs; 0.0 where loss_mask is False
    loss_mask: list[bool]  # (R,) True for sampled ids
    calls: int  # calls merged into this segment
    weight_versions: list[int]  # (calls,) weight_version of each merged call, in order
    finish_reason: str  # finish_reason of its last call


def _extends(prompt_ids: Sequence[int], seg: Segment) -> bool:
    p, r = len(seg.prompt_ids), len(seg.response_ids)
    return (len(prompt_ids) >= p + r and list(prompt_ids[:p]) == seg.prompt_ids
            and list(prompt_ids[p: p + r]) == seg.response_ids)


def merge_calls(calls: Sequence[CallRecord]) -> list[Segment]:
    """The calls of an episode, in order, as Segments (see the module docstring for the rule)."""
    segments: list[Segment] = []
    for c in calls:
        if len(c.logprobs) != len(c.completion_ids):
            raise ValueError(f"a call has {len(c.logprobs)} logprobs for {len(c.completion_ids)} completion ids")
        cur = segments[-1] if segments else None
        if cur is not None and _extends(c.prompt_ids, cur):
            glue = list(c.prompt_ids[len(cur.prompt_ids) + len(cur.response_ids):])
            cur.response_ids += glue + list(c.completion_ids)
            cur.logprobs += [0.0] * len(glue) + [float(x) for x in c.logprobs]
            cur.loss_mask += [False] * len(glue) + [True] * len(c.completion_ids)
            cur.calls += 1
            cur.weight_versions.append(c.weight_version)
            cur.finish_reason = c.finish_reason
            continue
        segments.append(Segment(prompt_ids=list(c.prompt_ids), response_ids=list(c.completion_ids),
                                logprobs=[float(x) for x in c.logprobs], loss_mask=[True] * len(c.completion_ids),
                                calls=1, weight_versions=[c.weight_version], finish_reason=c.finish_reason))
    return segments


@dataclass
class EpisodeRecord:
    """Everything the gateway saw under one API key, returned by Gateway.close_episode."""

    key: str
    name: str
    calls: list[CallRecord]  # answered calls, in the order they were answered
    errors: list[str]  # requests refused or failed under this key, "STATUS message" (e.g. "400 n must be 1")

    def segments(self) -> list[Segment]:
        """merge_calls(self.calls)."""
        return merge_calls(self.calls)

    @property
    def last_text(self) -> str:
        """The text of the last call ('' if none)."""
        return self.calls[-1].text if self.calls else ""
