"""The generated modules match the ``.proto`` sources."""

from cantata.proto import codegen


def test_generated_code_is_up_to_date():
    assert codegen.stale_files() == []
