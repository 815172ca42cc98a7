import pytest

from kvpool.engine_adapter.llm import LLM
from tests.connector.engines import GREEDY, PREFIX, QUESTION_B, make_engine


@pytest.fixture(autouse=True)
def _close_engines(monkeypatch):
    """Close the engines this test built (not those of module or session fixtures, built before it started). An
    engine dropped without `close()` leaves its connector's threads running, and they keep its staging rings and
    save buffers (~0.4 GB) for the rest of the process: the connector suites grew the test process to 16 GB of a
    24 GB machine."""
    made: list[LLM] = []
    init = LLM.__init__

    def tracked(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(LLM, "__init__", tracked)
    yield
    for engine in made:
        engine.close()


@pytest.fixture(scope="session")
def reference_b() -> list[int]:
    """B's greedy output with no pool at all: what every pooled run must reproduce."""
    with make_engine() as engine:
        return engine.generate([PREFIX + QUESTION_B], GREEDY)[0].token_ids
