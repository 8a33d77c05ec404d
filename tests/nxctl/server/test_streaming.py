"""Incremental text: stop strings held back, never shown, and the deltas add up to the final text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.outputs import RequestOutput
from nxctl.server.streaming import ChoiceStream, held_back


def out(text: str, n: int, finish: str | None = None) -> RequestOutput:
    return RequestOutput("r", [1], list(range(n)), text, finish_reason=finish)


def test_held_back_is_the_longest_suffix_that_starts_a_stop_string() -> None:
    assert held_back("abcEN", ("END",)) == 2
    assert held_back("abcE", ("END", "Ex")) == 1
    assert held_back("abc", ("END",)) == 0
    assert held_back("abcEND", ("END",)) == 0  # a whole stop string is the engine's to cut
    assert held_back("aa", ("aab",)) == 2


def test_a_stop_string_split_across_chunks_never_appears() -> None:
    stream = ChoiceStream(0, ("END",))
    texts = ["Hi E", "Hi EN", "Hi "]  # the engine cuts "Hi END" to "Hi " when it finishes
    deltas = [stream.advance(out(t, i + 1)) for i, t in enumerate(texts[:-1])]
    deltas.append(stream.advance(out(texts[-1], 3, "stop")))
    assert [d.text for d in deltas] == ["Hi ", "", ""]
    assert "".join(d.text for d in deltas) == "Hi "  # what was shown is all there is; no "E", no "EN"


def test_tokens_and_logprobs_are_sliced_per_delta() -> None:
    stream = ChoiceStream(0)
    first = stream.advance(RequestOutput("r", [1], [5, 6], "ab", logprobs=[-1.0, -2.0]))
    second = stream.advance(RequestOutput("r", [1], [5, 6, 7], "abc", "length", logprobs=[-1.0, -2.0, -3.0]))
    assert (first.token_ids, first.logprobs) == ([5, 6], [-1.0, -2.0])
    assert (second.token_ids, second.logprobs, second.text, second.finish_reason) == (
        [7],
        [-3.0],
        "c",
        "length",
    )


@given(
    pieces=st.lists(st.sampled_from(["a", "b", "E", "N", "D", "é", "\n"]), min_size=1, max_size=30),
    stop=st.sampled_from(["END", "aE", "ba", "\n\n"]),
)
def test_deltas_concatenate_to_the_final_text_and_never_show_a_stop(pieces: list[str], stop: str) -> None:
    """Simulate the engine: text grows piece by piece; at a stop string it is cut and the request ends."""
    stream, shown, text = ChoiceStream(0, (stop,)), [], ""
    for n, piece in enumerate(pieces):
        text += piece
        cut = text.find(stop)
        if cut >= 0:
            shown.append(stream.advance(out(text[:cut], n + 1, "stop")).text)
            final = text[:cut]
            break
        shown.append(stream.advance(out(text, n + 1)).text)
    else:
        final = text
        shown.append(stream.advance(out(text, len(pieces), "length")).text)
    assert "".join(shown) == final
    assert all(stop not in "".join(shown[: i + 1]) for i in range(len(shown)))
