"""One OpenAI chat request's path from its handler to the engine's inbox, as tests/trace_chat_request.py
follows it: it starts in its endpoint's own file, enters no file twice but a handful (issue 56: at most 5
re-entries), and ends in the engine loop's inbox."""

from __future__ import annotations

from collections import Counter

from tests.trace_chat_request import trace_chat_request


def test_a_chat_request_reads_top_to_bottom_in_its_handler_file() -> None:
    report = trace_chat_request()
    entered = Counter(stop.path for stop in report.stops)
    assert report.files[0] == "nxctl/server/openai_chat.py" and entered["nxctl/server/openai_chat.py"] == 1
    assert (report.stops[-1].path, report.stops[-1].function) == (
        "nxctl/server/bridge.py",
        "EngineLoop.submit",
    )
    assert report.reentries <= 5, "\n".join(report.lines())
