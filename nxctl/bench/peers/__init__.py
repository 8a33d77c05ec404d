"""The bench's subprocess peers: vLLM's CPU build, llama.cpp and CTranslate2, each in a venv of its own.

registry.py  what each peer is, where `make peers` installs it, its configurations (schedules)
protocol.py  the JSON job a driver reads and the answer it writes, checked
driver.py    one driver run as a subprocess: the answer, or one line saying why not
session.py   the peers of one bench run: skips, one driver process per configuration, outcomes
records.py   an answer as the bench's per-request records and work counts
hf_folder.py the model as a Hugging Face folder (for vLLM and CTranslate2), written from our loader
drive_*.py   the drivers: plain scripts run by the peer's own python (stdlib + that peer's library)
"""
