"""`kvpool demo` end to end: pool and three engine processes; B reuses A's prefix and answers exactly as B0."""

import pytest

from kvpool.cli import main
from kvpool.demo import run_demo

pytestmark = pytest.mark.slow


def test_demo_b_loads_the_prefix_and_matches_b0(tmp_path):
    result = run_demo(sections=8, max_tokens=4, dram="64MiB", ssd="64MiB", workdir=str(tmp_path), log=lambda *a: None)
    assert result.outputs_match
    assert result.pool_hit_tokens >= 16 * 10          # most of the ~380-token prefix, in whole blocks
    assert result.pool_hit_tokens % 16 == 0
    assert result.hit_tokens_by_tier == {"dram": result.pool_hit_tokens}


@pytest.mark.parametrize("argv, message", [
    (["demo", "--sections", "0"], "--sections must be between 1 and 45"),
    (["demo", "--max-tokens", "0"], "--max-tokens must be >= 1"),
])
def test_demo_bad_arguments(capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().out
