"""The release archive inside the unpack call (filter_plugins/dflash_inline.py): small ones
travel inline, a large one is left to the file push."""

from __future__ import annotations

import base64

from dflash_inline_filters import archive_b64


def test_a_small_archive_travels_inline_and_a_large_one_is_pushed(tmp_path):
    archive = tmp_path / "v1.tar.gz"
    archive.write_bytes(bytes(range(256)) * 40)
    assert base64.b64decode(archive_b64(str(archive))) == archive.read_bytes()
    assert archive_b64(str(archive), limit=10_239) == ""
    assert archive_b64(str(archive), limit=10_240) != ""
