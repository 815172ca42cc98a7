"""connector/cost.py: the load-or-recompute estimate, and the probe that keeps one slow load from disabling loads."""

from kvpool.connector.cost import LoadCostModel


def test_a_slow_first_load_is_re_measured_and_loading_comes_back():
    m = LoadCostModel(bytes_per_token=1000, probe_every=4)
    assert m.should_load(100)                      # priors favour loading: try it
    m.observe_load(100_000, 10.0)                  # the first load was very slow: 10 kB/s
    m.observe_prefill(100, 0.1)                    # prefill: 1,000 tokens/s
    assert [m.should_load(100) for _ in range(4)] == [False, False, False, True]  # the 4th is a probe
    m.observe_load(100_000, 0.001)                 # the pool is fast now (100 MB/s)
    m.observe_load(100_000, 0.001)
    assert m.should_load(100) and m.skipped == 0   # loads again on the estimate alone


def test_a_pool_slower_than_prefill_is_loaded_only_to_probe():
    m = LoadCostModel(bytes_per_token=1000, probe_every=3)
    m.observe_load(1_000, 1.0)                     # 1 kB/s: far slower than recompute
    m.observe_prefill(1_000, 0.01)
    assert [m.should_load(10) for _ in range(7)] == [False, False, True, False, False, True, False]
    assert not m.should_load(0)
