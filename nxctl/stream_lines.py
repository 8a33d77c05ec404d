"""The lines of a streamed HTTP body as the SSE and NDJSON formats define them.

A line ends at LF, CR LF or CR, and nowhere else: not at the other characters ``str.splitlines`` (and
``httpx``'s ``iter_lines``) break at, which a model's text may hold raw inside a JSON string (a peer
engine's stream does not escape U+2028). Splitting there would cut one event in two.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator

import httpx


class _Lines:
    """Accumulates text chunks and hands back the whole lines they complete."""

    def __init__(self) -> None:
        self.pending = ""

    def feed(self, chunk: str) -> list[str]:
        text = self.pending + chunk
        if text.endswith("\r"):  # a CR LF may be split across chunks: wait for the next one
            self.pending, text = "\r", text[:-1]
        else:
            self.pending = ""
        parts = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        self.pending = parts.pop() + self.pending
        return parts

    def rest(self) -> list[str]:
        """The last line: one ended by a CR still held, or text the body ended without a line end."""
        if self.pending.endswith("\r"):
            return [self.pending[:-1]]
        return [self.pending] if self.pending else []


def split_lines(chunks: Iterable[str]) -> Iterator[str]:
    """The lines of the text ``chunks`` join to, without their line ends."""
    lines = _Lines()
    for chunk in chunks:
        yield from lines.feed(chunk)
    yield from lines.rest()


def iter_stream_lines(response: httpx.Response) -> Iterator[str]:
    """``response``'s body, line by line, as it arrives."""
    return split_lines(response.iter_text())


async def aiter_stream_lines(response: httpx.Response) -> AsyncIterator[str]:
    """``response``'s body, line by line, as it arrives (an async client's stream)."""
    lines = _Lines()
    async for chunk in response.aiter_text():
        for line in lines.feed(chunk):
            yield line
    for line in lines.rest():
        yield line
