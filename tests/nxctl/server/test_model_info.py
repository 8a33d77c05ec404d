"""What /api/show, /api/tags and /api/ps report as a model's quantization level: Ollama's, the GGUF's
file type (Q4_K_M, Q5_0 ...), or the dtype a float model is held in."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import ollama
import pytest

from engine.loader import gguf_file
from engine.mux.registry import ModelSpec
from engine.settings import EngineSettings
from nxctl.server.app import create_app
from nxctl.server.model_info import model_info
from nxctl.server.settings import SeatSettings
from nxctl.server.uvicorn_seat import BackgroundSeat

GGUFS = Path(__file__).resolve().parents[3] / "fixtures" / "gguf"


@pytest.mark.parametrize(
    ("file", "level"),
    [("llama-q4_k_m.gguf", "Q4_K_M"), ("llama-q5_0.gguf", "Q5_0"), ("llama-iq4_xs.gguf", "IQ4_XS")],
)
def test_a_gguf_reports_its_file_type(file: str, level: str) -> None:
    spec = ModelSpec(id=0, name=file, source=str(GGUFS / file))
    assert model_info(spec).details()["quantization_level"] == level


def test_a_float_model_reports_the_dtype_it_is_held_in(small_gguf: Path) -> None:
    for dtype, level in [("float32", "F32"), ("bfloat16", "BF16"), ("float16", "F16")]:
        assert (
            model_info(
                ModelSpec(id=0, name="tiny", source="tiny", engine=EngineSettings(dtype=dtype))
            ).quantization_level
            == level
        )
    # a float32 GGUF is F32 whatever dtype it is held in (Ollama reports the file)
    spec = ModelSpec(id=0, name="f32", source=str(small_gguf), engine=EngineSettings(dtype="bfloat16"))
    assert model_info(spec).quantization_level == "F32"


@pytest.mark.parametrize("file_type", [None, gguf.LlamaFileType.GUESSED])
def test_without_a_file_type_the_type_of_most_matrix_elements(tmp_path: Path, file_type) -> None:
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    if file_type is not None:
        writer.add_file_type(file_type)
    q8 = gguf.quants.quantize(np.ones((64, 128), np.float32), gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.0.ffn_up.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((64, 32), np.float32))
    writer.add_tensor("blk.0.attn_norm.weight", np.zeros(10_000, np.float32))  # a vector: not counted
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert gguf_file.file_type(gguf_file.open_reader(path)) == "Q8_0"


def _levels(client: ollama.Client, tag: str) -> list[str | None]:
    """The quantization level /api/show, /api/tags and /api/ps report for ``tag``."""
    details = [client.show(tag).details]
    details += [m.details for m in client.list().models if m.model == tag]
    details += [m.details for m in client.ps().models if m.model == tag]
    return [d.quantization_level if d is not None else None for d in details]


def test_show_tags_and_ps_report_a_gguf_s_file_type(
    tmp_path: Path, tiny_settings: Callable[..., SeatSettings]
) -> None:
    settings = tiny_settings(
        tmp_path, models=("tiny", str(GGUFS / "llama-q4_k_m.gguf")), engine=EngineSettings(num_kv_blocks=32)
    )
    with BackgroundSeat(create_app(settings)) as url:
        client = ollama.Client(host=url)
        assert _levels(client, "llama-q4_k_m:latest") == ["Q4_K_M"] * 3
        assert _levels(client, "tiny:latest") == ["F32"] * 3
