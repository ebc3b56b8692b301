-- Aggregates over no rows: defaults of the type for non-Nullable arguments (0, '', nan for
-- avg, [] for groupArray), NULL for Nullable ones; the same in a group whose -If condition
-- matches nothing.
CREATE TABLE e (k UInt64, v Float64, i Int32, s String, d Date, n Nullable(Int32)) ENGINE = MergeTree ORDER BY k;
SELECT sum(v), sum(i), min(v), max(s), min(d), avg(v), any(s), anyLast(i), count(), uniq(k), sum(n), max(n), groupArray(k), argMax(s, v), argMin(i, v) FROM e;
SELECT count() FROM e WHERE k > 0 GROUP BY k;
INSERT INTO e VALUES (1, 2.5, -3, 'a', '2026-01-02', NULL), (2, 3, 4, 'b', '2026-02-03', 5), (2, 1, 7, 'c', '2026-03-04', NULL);
SELECT k, sumIf(v, v > 10), sumIf(i, i > 100), countIf(v > 10), minIf(s, v > 10), maxIf(d, v > 10), avgIf(v, v > 10), sum(n), anyIf(s, v > 10) FROM e GROUP BY k ORDER BY k;
SELECT sum(v), min(s), avg(i), sum(n) FROM e WHERE k > 5;
SELECT sum(v), any(k), max(s) FROM e WHERE k = ANY (SELECT k FROM e WHERE i > 5);
-- avg of a Decimal is a Float64 in ClickHouse (DataFusion's is a wider Decimal): nan over no
-- rows, NULL over Nullable ones, and the same value either way with rows.
CREATE TABLE dec (k UInt64, s String, x Decimal(12, 2), nx Nullable(Decimal(9, 3))) ENGINE = MergeTree ORDER BY k;
SELECT avg(x), avg(nx), sum(x) FROM dec;
INSERT INTO dec VALUES (1, 'a', 1.5, NULL), (2, 'b', 2.25, 1.125), (3, 'a', 3, NULL), (4, 'b', 0.01, 2);
SELECT avg(x), avg(nx), sum(x), avg(x) * 2 FROM dec;
SELECT s, avg(x), round(avg(x), 2), avg(nx), avgIf(x, k > 3) FROM dec GROUP BY s ORDER BY s;
SELECT s, avg(x) AS a FROM dec GROUP BY s ORDER BY a DESC;
