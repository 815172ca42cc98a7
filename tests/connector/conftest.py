import pytest

from tests.connector.engines import GREEDY, PREFIX, QUESTION_B, make_engine


@pytest.fixture(scope="session")
def reference_b() -> list[int]:
    """B's greedy output with no pool at all: what every pooled run must reproduce."""
    return make_engine().generate([PREFIX + QUESTION_B], GREEDY)[0].token_ids
