"""Text from files made safe to print: a run folder is data, and a name or message in it must
not move the cursor, retitle or clear the terminal, or reorder what the reader sees."""

from __future__ import annotations

# C0 controls but tab and newline, DEL, C1 controls (ESC's 8-bit forms among them), and the
# bidirectional overrides and isolates that reorder a line as it is shown.
_UNSAFE = ([c for c in range(0x20) if c not in (0x09, 0x0A)] + [0x7F] + list(range(0x80, 0xA0))
           + [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)])
# `\uXXXX`: readable in text, and the same character again in a JSON string.
_ESCAPES = {c: f"\\u{c:04x}" for c in _UNSAFE}


def terminal_safe(text: str) -> str:
    """`text` with each control character written as its `\\uXXXX` escape."""
    return text.translate(_ESCAPES)
