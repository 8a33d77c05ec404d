"""A copy of the `tiny` fixture whose tokenizer begins a text with BOS, as Llama 3's and Gemma's do
(tokenizer.json's post-processor adds it; tiny's adds nothing)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def tiny_with_bos(root: Path, chat_template: bool = True) -> tuple[Path, int]:
    """(the folder under ``root``, its BOS id): tiny, its post-processor adding BOS; without its chat
    template where ``chat_template`` is false."""
    folder = root / "tiny-bos"
    shutil.copytree(FIXTURES / "tiny", folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    if not chat_template:
        config.pop("chat_template")
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    bos = config["bos_token"]
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    bos_id = next(t["id"] for t in tokenizer["added_tokens"] if t["content"] == bos)
    tokenizer["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    return folder, bos_id
