"""A streamed body's lines end at LF, CR LF or CR only, however the body arrives in chunks: text that
holds the other characters ``str.splitlines`` breaks at (NEL, U+2028, ...) stays on its line."""

from __future__ import annotations

import asyncio

import httpx
from hypothesis import assume, given
from hypothesis import strategies as st

from nxctl.stream_lines import aiter_stream_lines, split_lines

LINE_TEXT = st.text(alphabet=st.sampled_from('ab é\x85\u2028\u2029\x0b\x0c\x1c{}":'), max_size=12)


def _chunked(text: str, cuts: list[int]) -> list[str]:
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@given(
    lines=st.lists(LINE_TEXT, min_size=1, max_size=6),
    ends=st.lists(st.sampled_from(["\n", "\r\n", "\r"]), min_size=6, max_size=6),
    cuts=st.lists(st.integers(0, 80), max_size=8),
)
def test_lines_come_back_whatever_the_line_ends_and_chunks(
    lines: list[str], ends: list[str], cuts: list[int]
):
    body = "".join(line + end for line, end in zip(lines, ends, strict=False))
    # a CR ending a line, then an empty line ended by LF, reads as one CR LF: the format cannot tell
    assume(not any(e == "\r" and n == "" for e, n in zip(ends, lines[1:], strict=False)))
    assert list(split_lines(_chunked(body, cuts))) == lines


def test_a_last_line_without_its_end_still_comes_back() -> None:
    assert list(split_lines(["data: 1\n\nda", "ta: 2"])) == ["data: 1", "", "data: 2"]


def test_an_async_stream_splits_alike() -> None:
    body = 'data: {"t":"a\u2028b"}\r\n\r\ndata: [DONE]\n\n'.encode()

    async def lines() -> list[str]:
        stream = httpx.ByteStream(body)
        response = httpx.Response(200, stream=stream)
        return [ln async for ln in aiter_stream_lines(response)]

    assert asyncio.run(lines()) == ['data: {"t":"a\u2028b"}', "", "data: [DONE]", ""]
