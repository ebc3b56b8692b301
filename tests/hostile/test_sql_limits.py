"""ClickHouse's query limits, side by side: at each boundary the statement ClickHouse 26.9
still runs runs here too, and the first one it refuses is refused here with the same error
name. The oracle is chDB, asked the same statements in the same run."""

import pytest

from harness import run_ours


def chain(n):
    return "+".join(["1"] * n)


def conditions(n, op="AND"):
    return f" {op} ".join(f"x != {i}" for i in range(n))


# (statement, ClickHouse's error name when refused)
BOUNDARIES = [
    (lambda n: f"SELECT {chain(n)}", 498, "TOO_DEEP_AST"),
    (lambda n: f"SELECT count() FROM t WHERE x = {chain(n)}", 498, "TOO_DEEP_AST"),
    (lambda n: f"SELECT {'abs(' * n}1{')' * n}", 497, "TOO_DEEP_AST"),
    (lambda n: f"SELECT {'(' * n}1{')' * n}", 197, "TOO_DEEP_RECURSION"),
    (lambda n: f"SELECT count() FROM t WHERE {conditions(n)}", 12497, "TOO_BIG_AST"),
]


@pytest.mark.parametrize("make,last_ok,error", BOUNDARIES, ids=["plus", "where", "calls", "brackets", "and"])
def test_limits_agree_with_clickhouse(tmp_path, oracle, make, last_ok, error):
    setup = "CREATE TABLE t (x UInt64) ENGINE = MergeTree ORDER BY x; INSERT INTO t VALUES (1), (2);"
    assert run_ours(setup, path=tmp_path).code == 0
    for n, accepted in ((last_ok, True), (last_ok + 1, False)):
        sql = make(n)
        ours = run_ours(sql + ";", path=tmp_path)
        try:
            theirs = oracle.run(setup + sql)
            theirs_ok, their_error = True, ""
        except Exception as e:  # chDB raises with ClickHouse's message
            theirs_ok, their_error = False, str(e)
        assert theirs_ok == accepted, (n, their_error[:300])
        assert (ours.code == 0) == accepted, (n, ours.stderr[-500:])
        if accepted:
            assert ours.stdout.strip() == theirs.strip()
        else:
            assert error in ours.stderr, ours.stderr[-500:]
            # chDB names TOO_BIG_AST "AST is too big"; the rest by their codes.
            assert error in their_error or ("too big" in their_error and error == "TOO_BIG_AST"), their_error[:300]
