"""Bad statements fail in mergestream with ClickHouse's own message, and name where they are."""

import re

import pytest

from harness import run_ours

REJECTED = [
    "CREATE TABLE e (k UInt64, v UInt64) ENGINE = ReplacingMergeTree(v, v) ORDER BY k",
    "CREATE TABLE e (k UInt64, v UInt64, d UInt16) ENGINE = ReplacingMergeTree(v, d) ORDER BY k",
    "CREATE TABLE e (k UInt64, v String) ENGINE = ReplacingMergeTree(v) ORDER BY k",
    "CREATE TABLE e (k UInt64, v UInt64) ENGINE = ReplacingMergeTree(x) ORDER BY k",
    "CREATE TABLE e (k UInt64, v UInt64, d UInt8) ENGINE = ReplacingMergeTree(v, x) ORDER BY k",
    "CREATE TABLE e (k UInt64, v Nullable(UInt64)) ENGINE = ReplacingMergeTree(v) ORDER BY k",
    "CREATE TABLE e (k UInt64, s Int16) ENGINE = CollapsingMergeTree(s) ORDER BY k",
    "CREATE TABLE e (k UInt64, v UInt64, s Int8) ENGINE = VersionedCollapsingMergeTree(s, s) ORDER BY k",
    "CREATE TABLE e (k UInt64, v String, s Int8) ENGINE = VersionedCollapsingMergeTree(s, v) ORDER BY k",
    "CREATE TABLE e (k UInt64, v UInt64) ENGINE = SummingMergeTree((x)) ORDER BY k",
    "CREATE TABLE e (k UInt64, s UInt64, c SimpleAggregateFunction(sum, UInt64)) ENGINE = AggregatingMergeTree ORDER BY k",
    "CREATE TABLE e (k Nullable(UInt64), v UInt64) ENGINE = MergeTree ORDER BY k",
    "CREATE TABLE e (k UInt64, v UInt64) ENGINE = MergeTree ORDER BY k PRIMARY KEY v",
    "CREATE TABLE e (k UInt64, v UInt64) ENGINE = MergeTree ORDER BY k SETTINGS foo = 1",
    "CREATE TABLE e (k UInt64, v UInt64) ENGINE = ReplacingMergeTree(v) ORDER BY k;"
    " OPTIMIZE TABLE e FINAL CLEANUP",
    "CREATE TABLE e (k UInt64, v UInt64) ENGINE = SummingMergeTree ORDER BY k"
    " SETTINGS allow_experimental_replacing_merge_with_cleanup = 1; OPTIMIZE TABLE e FINAL CLEANUP",
    "CREATE TABLE e (k UInt64, v UInt64) ENGINE = MergeTree ORDER BY k; SELECT * FROM e FINAL",
    "CREATE TABLE e (k UInt64, v UInt64) ENGINE = MergeTree ORDER BY k; INSERT INTO e VALUES (1, 1);"
    " SYSTEM STOP MERGES e; OPTIMIZE TABLE e FINAL",
]


def clickhouse_message(oracle, script):
    with pytest.raises(Exception) as raised:
        oracle.run(script)
    text = str(raised.value)
    match = re.search(r"DB::Exception: (.*?)\.? \([A-Z_]+\)", text, re.S)
    assert match, text
    message = match.group(1)
    # ClickHouse appends hints after the first sentence for some errors; compare the sentence.
    return message.split(" while processing")[0].split(": for storage")[0]


@pytest.mark.parametrize("script", REJECTED)
def test_rejected_with_clickhouse_message(script, oracle):
    expected = clickhouse_message(oracle, script)
    ours = run_ours(script)
    assert ours.code != 0
    assert expected in ours.stderr, ours.stderr


def test_syntax_errors_name_line_and_column():
    ours = run_ours("CREATE TABLE t (k UInt64) ENGINE = MergeTree ORDER BY k;\nSELECT 1;\nINSERT INTO t VALUES (1, 2)")
    assert ours.code != 0
    assert "statement 3 at 3:1" in ours.stderr
    assert "3:22" in ours.stderr and "expected 1 values in the row, found 2" in ours.stderr
    ours = run_ours("CREATE TABLE t (k Strin) ENGINE = MergeTree ORDER BY k")
    assert "1:19" in ours.stderr and "unknown data type 'Strin'" in ours.stderr


def test_statements_before_a_failure_take_effect(tmp_path):
    ours = run_ours(
        "CREATE TABLE t (k UInt64) ENGINE = MergeTree ORDER BY k; INSERT INTO t VALUES (1); "
        "INSERT INTO t VALUES ('x'); INSERT INTO t VALUES (3)",
        path=tmp_path,
    )
    assert ours.code != 0 and "statement 3" in ours.stderr
    again = run_ours("SELECT k FROM t ORDER BY k", path=tmp_path)
    assert again.stdout == "1\n"
