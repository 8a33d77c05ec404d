"""The subprocess peers without any peer installed: the HF folder writer, the JSON protocol, the driver
runner (with stand-in driver scripts) and the skips."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from engine.loader import LoadedModel, load_model
from engine.workload import WorkloadRequest
from nxctl.bench.peers.driver import run_driver
from nxctl.bench.peers.hf_folder import cached_hf_folder, write_hf_folder
from nxctl.bench.peers.protocol import PeerError, make_job, parse_answer
from nxctl.bench.peers.records import chunk_times, decode_tps, schedule_run
from nxctl.bench.peers.registry import SPECS
from nxctl.bench.peers.session import PeerRuns, not_installed_line

REQUESTS = [
    WorkloadRequest(0, [5, 6, 7], 3, 0.0, "default"),
    WorkloadRequest(1, [8, 9], 2, 0.0, "default"),
]

FAKE_DRIVER = Path(__file__).resolve().parents[1] / "fake_peer_driver.py"  # token 1 every 10 ms


def _script(tmp_path: Path, body: str, name: str = "driver.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def _job() -> dict:
    return make_job("model", {"dtype": "float32"}, 2, 4, 2, {"workload": REQUESTS})


def test_hf_folder_round_trips_through_our_loader(tiny_loaded: LoadedModel, tmp_path: Path) -> None:
    write_hf_folder(tiny_loaded, tmp_path / "tiny-hf")
    again = load_model(tmp_path / "tiny-hf")
    ours, theirs = tiny_loaded.config, again.config
    assert {**vars(ours), "name": ""} == {**vars(theirs), "name": ""}
    assert again.weights.keys() == tiny_loaded.weights.keys()
    for name, tensor in tiny_loaded.dense_weights().items():
        assert torch.equal(again.dense_weights()[name], tensor), name
    text = "<|im_start|>user\nThe quick brown fox.<|im_end|>"
    assert again.tokenizer.encode(text) == tiny_loaded.tokenizer.encode(text)
    assert again.tokenizer.chat_template == tiny_loaded.tokenizer.chat_template
    assert again.tokenizer.stop_token_ids == tiny_loaded.tokenizer.stop_token_ids
    assert (again.tokenizer.bos_token, again.tokenizer.eos_token) == (
        tiny_loaded.tokenizer.bos_token,
        tiny_loaded.tokenizer.eos_token,
    )
    messages = [{"role": "user", "content": "hi"}]
    assert again.tokenizer.encode_chat(messages) == tiny_loaded.tokenizer.encode_chat(messages)


def test_hf_folder_is_cached_once(tiny_loaded: LoadedModel, tmp_path: Path) -> None:
    first = cached_hf_folder(tiny_loaded, tmp_path)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert cached_hf_folder(tiny_loaded, tmp_path) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "models").iterdir()] == [first.name]  # no partial folder left


def test_a_stand_in_driver_answers_through_the_protocol(tmp_path: Path) -> None:
    job = _job()
    answer = run_driver(Path(sys.executable), FAKE_DRIVER, job, {})
    assert answer.load_s == 0.5 and answer.info == {"engine": "fake"}
    assert len(answer.runs["workload"]) == 2
    run = schedule_run(REQUESTS, answer.runs["workload"][0])
    assert [r.output_tokens for r in run.records] == [3, 2] and run.duration == pytest.approx(0.03)
    assert run.records[0].chunk_times == pytest.approx([0.01, 0.02, 0.03])
    # computed rows: each prompt then each fed-back token; one forward per token, as the driver said
    assert run.work.computed_rows == (3 + 3 - 1) + (2 + 2 - 1) and run.work.forwards == 5
    assert decode_tps(answer.runs["workload"][0].requests[0]) == pytest.approx(100.0)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("import sys\nprint('loading')\nraise SystemExit('boom: no AVX')\n", "exit status 1: boom: no AVX"),
        ("import sys\nprint('tail', file=sys.stderr)\nsys.exit(3)\n", "exit status 3: tail"),
        ("pass\n", "exited without writing its answer"),
        ("import sys\nopen(sys.argv[2], 'w').write('{oops')\n", "not JSON"),
        ("import sys, json\njson.dump({'protocol': 7}, open(sys.argv[2], 'w'))\n", "protocol 7"),
    ],
)
def test_a_bad_driver_is_one_line(tmp_path: Path, body: str, needle: str) -> None:
    with pytest.raises(PeerError) as caught:
        run_driver(Path(sys.executable), _script(tmp_path, body), _job(), {}, log=tmp_path / "logs" / "x.log")
    message = str(caught.value)
    assert needle in message and "\n" not in message
    assert (tmp_path / "logs" / "x.log").is_file()


def _answer(**request: object) -> dict:
    good = {"token_ids": [1, 2, 3], "token_times": [0.1, 0.2, 0.3], "end_s": 0.3}
    second = {"token_ids": [4, 5], "token_times": None, "end_s": 0.2}
    run = {"duration_s": 0.3, "forwards": None, "requests": [good | request, second]}
    return {"protocol": 1, "load_s": 1.0, "runs": {"workload": [run, run]}}


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"token_ids": [1, 2]}, r"generated 2 tokens \(2 ids\), 3 were asked"),
        ({"token_ids": [1, 2, 3, 4], "output_tokens": 3}, r"generated 3 tokens \(4 ids\)"),
        ({"token_ids": [1, 2], "output_tokens": 2}, r"generated 2 tokens \(2 ids\), 3 were asked"),
        ({"token_times": [0.3, 0.2, 0.1]}, "go backwards"),
        ({"token_times": [0.1]}, "one time per token"),
        ({"end_s": 0.1}, "ends before its last token"),
        ({"token_ids": [1, 2, "x"]}, "not a list of integers"),
        ({"cached_tokens": 9}, "not within its prompt"),
    ],
)
def test_a_bad_answer_names_what_is_wrong(change: dict, needle: str) -> None:
    with pytest.raises(PeerError, match=needle):
        parse_answer(_answer(**change), _job())


def test_answer_shape_checks() -> None:
    assert parse_answer(_answer(), _job()).runs["workload"][1].requests[1].token_times is None
    with pytest.raises(PeerError, match="2 repeat"):
        parse_answer({**_answer(), "runs": {"workload": []}}, _job())
    with pytest.raises(PeerError, match="not a JSON object"):
        parse_answer([], _job())
    bad_batches = _answer()
    bad_batches["runs"]["workload"][0] = {**bad_batches["runs"]["workload"][0], "batches": [[0], [0]]}
    with pytest.raises(PeerError, match="each request once"):
        parse_answer(bad_batches, _job())


def test_static_batches_count_their_padding() -> None:
    data = _answer()
    data["runs"]["workload"][0] = {**data["runs"]["workload"][0], "batches": [[0, 1]]}
    run = schedule_run(REQUESTS, parse_answer(data, _job()).runs["workload"][0])
    assert run.work.computed_rows == 2 * (3 + 3 - 1) and run.work.forwards == 3
    data["runs"]["workload"][0]["forwards"] = 4  # the peer's own count wins
    assert schedule_run(REQUESTS, parse_answer(data, _job()).runs["workload"][0]).work.forwards == 4
    assert chunk_times([0.1, 0.1, 0.2]) == [0.1, 0.2] and chunk_times(None) == []


def test_peers_not_installed_are_skipped_with_one_line(tiny_loaded: LoadedModel, tmp_path: Path) -> None:
    said: list[str] = []
    runs = PeerRuns(
        tiny_loaded, REQUESTS, ("hf", "vllm", "llamacpp"), ("vllm_f32",), tmp_path, 2, 4, 1, said.append
    )
    assert said == [not_installed_line("vllm"), not_installed_line("llamacpp")]
    assert said[0] == "peer vllm not installed: run `make peers`"
    assert runs.schedules() == () and runs.outcome("vllm_f32") is None


def _fake_venv(peers_dir: Path, name: str) -> None:
    bin_dir = SPECS[name].python(peers_dir).parent
    bin_dir.mkdir(parents=True)
    SPECS[name].python(peers_dir).symlink_to(sys.executable)
    (SPECS[name].venv(peers_dir) / ".installed").touch()


def test_a_gguf_peer_skips_a_folder_model(tiny_loaded: LoadedModel, tmp_path: Path) -> None:
    _fake_venv(tmp_path, "llamacpp")
    said: list[str] = []
    PeerRuns(tiny_loaded, REQUESTS, ("llamacpp",), ("llamacpp",), tmp_path, 2, 4, 1, said.append)
    assert len(said) == 1 and "runs a .gguf file" in said[0]


def test_a_crashing_peer_is_skipped_with_its_reason(tiny_loaded: LoadedModel, tmp_path: Path) -> None:
    _fake_venv(tmp_path, "ct2")  # this python has no ctranslate2: the real driver dies importing it
    said: list[str] = []
    runs = PeerRuns(tiny_loaded, REQUESTS, ("ct2",), ("ct2_int8", "single"), tmp_path, 2, 4, 1, said.append)
    assert runs.outcome("ct2_int8") is None
    assert len(said) == 1 and said[0].startswith("peer ct2_int8 failed: exit status 1:")
    assert "ctranslate2" in said[0]
    assert json.loads((tmp_path / "models").iterdir().__next__().joinpath("config.json").read_text())


def test_a_relative_model_path_reaches_the_driver_absolute(
    small_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver runs in a temporary folder: `--model .peers/x.gguf` must reach it as an absolute path."""
    _fake_venv(tmp_path, "llamacpp")
    monkeypatch.chdir(small_gguf.parent)
    loaded = load_model(small_gguf.name)
    assert not loaded.source.path.is_absolute()
    jobs: list[dict[str, object]] = []

    def driver(*args: object, **_: object) -> None:
        jobs.append(args[2])  # type: ignore[arg-type]  # run_driver(python, driver, job, env, log)
        raise PeerError("stopped after the job was written")

    monkeypatch.setattr("nxctl.bench.peers.session.run_driver", driver)
    said: list[str] = []
    runs = PeerRuns(loaded, REQUESTS, ("llamacpp",), ("llamacpp",), tmp_path, 2, 4, 1, said.append)
    assert runs.outcome("llamacpp") is None
    assert jobs and jobs[0]["model"] == str(small_gguf.resolve())
