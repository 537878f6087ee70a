"""Issue 11, item 5 (counting): whatever a text's shape, it is encoded in bounded pieces.

Encoding one multi-megabyte pre-token is superlinear in tiktoken: a 20 MB run without breaks
took over ten seconds to count, even for a request that was then passed through unchanged.
"""

from __future__ import annotations

import pytest

from proxy.tokens.counter import TokenCounter, pieces
from proxy.tokens.encodings import load_encoding

SIZE, RUN = 1 << 16, 1 << 13
SHAPES = {
    "one character": "a" * 600_000,
    "digits": "7" * 600_000,
    "base64-like": ("QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0MTIzNDU2Nzg5" * 13_000),
    "CJK without spaces": "漢字仮名交じり文" * 80_000,
    "emoji": "😀" * 300_000,
    "spaces only": " " * 600_000,
    "newlines only": "\n" * 600_000,
    "punctuation": ";.,!" * 150_000,
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_no_piece_is_longer_than_the_bound_whatever_the_shape(shape: str) -> None:
    text = SHAPES[shape]
    parts = list(pieces(text))

    assert "".join(parts) == text
    assert max(len(p) for p in parts) <= SIZE + RUN


@pytest.mark.parametrize("shape", ["one character", "CJK without spaces", "spaces only"])
def test_the_bounded_count_stays_close_to_the_exact_one(shape: str) -> None:
    encoding = load_encoding("o200k_base")
    text = SHAPES[shape]
    exact = len(encoding.encode_ordinary(text))
    counted = TokenCounter(encoding, cache_size=0).count_text(text)

    assert exact <= counted <= exact + 2 * (len(text) // SIZE + 1)
