"""JSON-lines logs appended across sessions, one of them killed mid-line."""

from __future__ import annotations

from infra import jsonl


def test_a_torn_last_line_is_closed_and_skipped(tmp_path):
    path = tmp_path / "log.jsonl"
    jsonl.append(path, {"session_start": 0})
    jsonl.append(path, {"step": 1, "loss": 0.5})
    with open(path, "a") as f:  # a session SIGKILLed halfway through writing step 2
        f.write('{"step": 2, "lo')
    jsonl.append(path, {"session_start": 1})
    jsonl.append(path, {"step": 2, "loss": 0.25})
    assert jsonl.read(path) == [
        {"session_start": 0},
        {"step": 1, "loss": 0.5},
        {"session_start": 1},
        {"step": 2, "loss": 0.25},
    ]
    assert path.read_text().splitlines()[2] == '{"step": 2, "lo'  # the torn line stays, on a line of its own


def test_a_missing_log_reads_empty(tmp_path):
    assert jsonl.read(tmp_path / "none.jsonl") == []
