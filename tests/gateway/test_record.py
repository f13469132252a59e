"""rlvr.gateway.record: merging an episode's calls into trainable segments (the extension rule), by hand."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import REPO

from rlvr.gateway.record import CallRecord, EpisodeRecord, Segment, merge_calls


def call(prompt, completion, lp=-0.5, version=0, finish="stop", text=""):
    return CallRecord(prompt_ids=list(prompt), completion_ids=list(completion), logprobs=[lp] * len(completion),
                      weight_version=version, finish_reason=finish, text=text, endpoint="chat")


def test_calls_that_extend_merge_into_one_segment_with_the_glue_out_of_the_loss():
    c1 = call([1, 2, 3], [4, 5], lp=-0.1, version=7, text="first")
    c2 = call([1, 2, 3, 4, 5, 8, 9], [6], lp=-0.2, version=8, finish="length", text="second")  # 8, 9: a tool turn
    c3 = call([1, 2, 3, 4, 5, 8, 9, 6], [7, 7], lp=-0.3, version=8, finish="tool_calls")  # no glue at all
    (seg,) = merge_calls([c1, c2, c3])
    assert seg == Segment(prompt_ids=[1, 2, 3], response_ids=[4, 5, 8, 9, 6, 7, 7],
                          logprobs=[-0.1, -0.1, 0.0, 0.0, -0.2, -0.3, -0.3],
                          loss_mask=[True, True, False, False, True, True, True], calls=3, weight_versions=[7, 8, 8],
                          finish_reason="tool_calls")


def test_a_rewritten_history_starts_a_new_segment():
    c1 = call([1, 2, 3], [4, 5])
    c2 = call([1, 9, 3, 4, 5, 8], [6])  # an earlier id changed
    c3 = call([1, 9, 3, 4, 5, 8, 6, 0], [2])  # extends c2's segment
    c4 = call([1, 2, 3, 4], [5])  # shorter than the segment so far: a new one
    segs = merge_calls([c1, c2, c3, c4])
    assert [s.calls for s in segs] == [1, 2, 1]
    assert segs[1].prompt_ids == [1, 9, 3, 4, 5, 8] and segs[1].response_ids == [6, 0, 2]
    assert segs[1].loss_mask == [True, False, True]
    assert segs[2].prompt_ids == [1, 2, 3, 4]


def test_every_segment_keeps_the_shapes_aligned_and_empty_completions_merge():
    segs = merge_calls([call([1], []), call([1, 2], [3]), call([1, 2, 3], [])])
    (seg,) = segs
    assert len(seg.response_ids) == len(seg.logprobs) == len(seg.loss_mask) == 2
    assert seg.loss_mask == [False, True] and seg.calls == 3
    assert merge_calls([]) == []
    bad = call([1], [2, 3])
    bad.logprobs = [0.0]
    with pytest.raises(ValueError, match="1 logprobs for 2 completion ids"):
        merge_calls([bad])


def test_episode_record_segments_and_last_text():
    rec = EpisodeRecord(key="k", name="ex#0", calls=[call([1], [2], text="a"), call([1, 2, 5], [3], text="b")],
                        errors=["400 n must be 1"])
    assert rec.last_text == "b" and len(rec.segments()) == 1 and rec.segments()[0].response_ids == [2, 5, 3]
    assert EpisodeRecord("k", "n", [], []).last_text == "" and EpisodeRecord("k", "n", [], []).segments() == []


def test_the_record_and_the_package_import_no_torch_and_no_server():
    code = ("import sys, rlvr.gateway, rlvr.gateway.record, rlvr.gateway.tools; "
            "print(sorted(m for m in ('torch', 'transformers', 'fastapi', 'uvicorn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert out.strip() == "[]"
