-- DEFAULT values for columns an insert leaves out, and numbers as conditions.
CREATE TABLE t (k UInt64, n UInt32 DEFAULT 7, s String DEFAULT 'none', f Float64 DEFAULT -1.5, z Nullable(Int8)) ENGINE = MergeTree ORDER BY k;
INSERT INTO t (k) VALUES (1);
INSERT INTO t (k, s) VALUES (2, 'given');
INSERT INTO t FORMAT JSONEachRow {"k": 3, "n": 1}
{"k": 4, "f": 2.5};
SELECT * FROM t ORDER BY k;
DESCRIBE TABLE t;
SELECT k FROM t WHERE k % 2 AND n > 0 ORDER BY k;
SELECT name FROM system.parts WHERE database = currentDatabase() AND table = 't' AND active ORDER BY name;
