"""KeepAlive: Ollama's keep_alive values, the seat's default resolved late, and what unloads at once."""

from __future__ import annotations

import pytest

from engine.errors import InvalidRequestError
from nxctl.server.keep_alive import Keep, KeepAlive


def test_parse_reads_each_kind_of_keep_alive() -> None:
    assert KeepAlive.parse(None) == KeepAlive() and KeepAlive().kind is Keep.DEFAULT
    assert KeepAlive.parse("5m") == KeepAlive(Keep.FOR, 300.0)
    assert KeepAlive.parse(0) == KeepAlive(Keep.FOR, 0.0)
    assert KeepAlive.parse(-1) == KeepAlive.parse("-1m") == KeepAlive(Keep.FOREVER)
    with pytest.raises(InvalidRequestError, match="keep_alive"):
        KeepAlive.parse("soon")


def test_resolve_puts_the_seat_default_in_place_of_default_only() -> None:
    assert KeepAlive().resolve(300.0) == 300.0 and KeepAlive().resolve(None) is None
    assert KeepAlive.of(10).resolve(300.0) == 10.0
    assert KeepAlive.of(None).resolve(300.0) is None


def test_only_an_explicit_zero_unloads_now() -> None:
    assert KeepAlive.parse(0).unloads_now
    assert (
        not KeepAlive().unloads_now and not KeepAlive.of(None).unloads_now and not KeepAlive.of(1).unloads_now
    )


def test_invalid_combinations_are_refused() -> None:
    for kind, seconds in ((Keep.FOR, -1.0), (Keep.DEFAULT, 5.0), (Keep.FOREVER, 1.0)):
        with pytest.raises(ValueError):
            KeepAlive(kind, seconds)
