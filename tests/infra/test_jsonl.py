"""JSON-lines logs appended across sessions, one of them killed mid-line; damage elsewhere refused."""

from __future__ import annotations

import logging
import re

import pytest

from infra import jsonl


def test_a_torn_last_line_is_skipped_with_a_warning_then_cut_off_by_the_next_append(tmp_path, caplog):
    path = tmp_path / "log.jsonl"
    jsonl.append(path, {"session_start": 0})
    jsonl.append(path, {"step": 1, "loss": 0.5})
    with open(path, "a") as f:  # a session SIGKILLed halfway through writing step 2
        f.write('{"step": 2, "lo')
    with caplog.at_level(logging.WARNING, logger="infra.jsonl"):
        assert jsonl.read(path) == [{"session_start": 0}, {"step": 1, "loss": 0.5}]
    assert "skipped its torn last line 3 (15 bytes, no newline)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="infra.jsonl"):
        jsonl.append(path, {"session_start": 1})
        jsonl.append(path, {"step": 2, "loss": 0.25})
    assert caplog.text.count("cut off a torn last line (15 bytes)") == 1
    assert jsonl.read(path) == [
        {"session_start": 0},
        {"step": 1, "loss": 0.5},
        {"session_start": 1},
        {"step": 2, "loss": 0.25},
    ]
    assert path.read_bytes().count(b"\n") == 4 and b'"lo\n' not in path.read_bytes()


def test_a_whole_last_record_without_its_newline_is_kept(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}')
    assert jsonl.read(path) == [{"step": 1}, {"step": 2}]
    jsonl.append(path, {"step": 3})
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n{"step": 3}\n'


@pytest.mark.parametrize("bad", ['{"step": 2, "lo', "", "[1, 2]", "\xff\xfe"])
def test_a_bad_line_before_the_last_is_an_error_naming_the_file_and_line(tmp_path, bad):
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"step": 1}\n' + bad.encode("latin-1") + b'\n{"step": 3}\n')
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}, line 2: not a JSON object record: "):
        jsonl.read(path)


def test_a_torn_line_longer_than_a_read_chunk_is_cut_off(tmp_path):
    path = tmp_path / "log.jsonl"
    jsonl.append(path, {"step": 1})
    with open(path, "a") as f:
        f.write('{"keys": ["' + "k" * 200_000)
    jsonl.append(path, {"step": 2})
    assert jsonl.read(path) == [{"step": 1}, {"step": 2}]


def test_a_missing_log_reads_empty(tmp_path):
    assert jsonl.read(tmp_path / "none.jsonl") == []
