"""Randomized differential tests: the same generated scenario on mergestream and ClickHouse."""

import os

import pytest

from differential.generate import ENGINES, Scenario
from harness import run_ours

SEEDS = int(os.environ.get("MERGESTREAM_RANDOM_SEEDS", "40"))


@pytest.mark.parametrize("seed", range(SEEDS))
@pytest.mark.parametrize("engine", ENGINES)
def test_random_scenario_matches_clickhouse(engine, seed, oracle):
    script = Scenario(engine, seed).script()
    expected = oracle.run(script)
    ours = run_ours(script)
    assert ours.code == 0, f"{ours}\n--- script ---\n{script}"
    assert ours.stdout == expected, f"--- script ---\n{script}"
