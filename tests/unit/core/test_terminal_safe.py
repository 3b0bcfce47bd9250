"""Text from run folders is printed with its control characters escaped (analysis.core.terminal):
a manifest message or a kernel name cannot drive the user's terminal."""

import json

from analysis.core.terminal import terminal_safe


def test_escape_sequences_and_controls_are_written_as_escapes():
    hostile = "title\x1b]0;pwned\x07 clear\x1b[2J\x1bc back\rspace\x08 csi\x9b31m del\x7f"
    safe = terminal_safe(hostile)
    assert safe == ("title\\u001b]0;pwned\\u0007 clear\\u001b[2J\\u001bc back\\u000dspace\\u0008"
                    " csi\\u009b31m del\\u007f")
    assert all(ord(c) >= 0x20 and not 0x7F <= ord(c) < 0xA0 for c in safe)


def test_bidirectional_overrides_are_escaped_and_plain_text_is_kept():
    assert terminal_safe("a\u202eb\u2066c\u200fd") == "a\\u202eb\\u2066c\\u200fd"
    plain = "rank 1\tall_reduce 4.0 MB\nnext line: ünïcødé, 中文, ✓"
    assert terminal_safe(plain) == plain


def test_an_escaped_json_document_reads_back_as_the_same_values():
    document = {"name": "kernel\x9b2J\u202e", "message": "\x1b[31mred"}
    text = json.dumps(document, ensure_ascii=False)
    assert json.loads(terminal_safe(text)) == document


def test_the_command_never_prints_a_control_character_from_a_run_folder(tmp_path, capsys):
    from analysis import breakdown
    from helpers.synthetic import TraceBuilder, trace_name

    run = tmp_path / "run\x1b]0;retitled\x07\x1b[2J"
    run.mkdir()
    for rank in (0, 1):
        builder = TraceBuilder(rank=rank, world_size=3)
        builder.step(1, 0, 100).kernel("gemm\x1b[31m\u202e", 10, 60)
        builder.write(run / trace_name(rank))
    assert breakdown.main([str(run), "--no-cache"]) == 0
    printed = capsys.readouterr()
    assert "\\u001b]0;retitled\\u0007" in printed.err
    for text in (printed.out, printed.err):
        assert not any(ord(c) < 0x20 and c not in "\t\n" for c in text)
        assert "\u202e" not in text and "\x9b" not in text
