"""Hand-written scenarios (cases/*.sql): the output of mergestream equals ClickHouse's, exactly."""

from pathlib import Path

import pytest

from harness import run_ours

CASES = sorted((Path(__file__).parent / "cases").glob("*.sql"))


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_case_matches_clickhouse(case, oracle):
    script = case.read_text()
    expected = oracle.run(script)
    ours = run_ours(script)
    assert ours.code == 0, ours
    assert ours.stdout == expected
