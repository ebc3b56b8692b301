-- Partition ids and values as ClickHouse names them: integers, dates, tuples, and hashed
-- ids for keys with strings.
CREATE TABLE p1 (d Date, k UInt64, s String, i Int32) ENGINE = MergeTree PARTITION BY toYYYYMM(d) ORDER BY k;
INSERT INTO p1 VALUES ('2026-10-10', 1, 'a', -5), ('2026-11-01', 2, 'b', 3);
CREATE TABLE p2 (d Date, k UInt64, s String, i Int32) ENGINE = MergeTree PARTITION BY d ORDER BY k;
INSERT INTO p2 VALUES ('2026-10-10', 1, 'a', -5);
CREATE TABLE p3 (d Date, k UInt64, s String, i Int32) ENGINE = MergeTree PARTITION BY s ORDER BY k;
INSERT INTO p3 VALUES ('2026-10-10', 1, 'a', -5), ('2026-10-10', 2, 'hello, world', 1), ('2026-10-10', 3, '', 1);
CREATE TABLE p4 (d Date, k UInt64, s String, i Int32) ENGINE = MergeTree PARTITION BY i ORDER BY k;
INSERT INTO p4 VALUES ('2026-10-10', 1, 'a', -5);
CREATE TABLE p5 (d Date, k UInt64, s String, i Int32) ENGINE = MergeTree PARTITION BY (k, i) ORDER BY k;
INSERT INTO p5 VALUES ('2026-10-10', 1, 'a', -5);
CREATE TABLE p6 (d Date, k UInt64, s String, i Int32) ENGINE = MergeTree PARTITION BY k % 4 ORDER BY k;
INSERT INTO p6 VALUES ('2026-10-10', 7, 'a', -5);
CREATE TABLE p7 (d DateTime, k UInt64, s String, i Int32) ENGINE = MergeTree PARTITION BY toStartOfMonth(d) ORDER BY k;
INSERT INTO p7 VALUES ('2026-10-10 00:00:00', 7, 'a', -5);
CREATE TABLE p8 (d Date, k UInt64, s LowCardinality(String), i Int32) ENGINE = MergeTree PARTITION BY (i, s) ORDER BY k;
INSERT INTO p8 VALUES ('2026-10-10', 1, 'it''s', -5), ('2026-10-10', 1, 'b', 7);
CREATE TABLE p9 (d Date, k UInt64, s String, i Int32) ENGINE = MergeTree PARTITION BY (d, s) ORDER BY k;
INSERT INTO p9 VALUES ('2026-10-10', 1, 'x', -5);
SELECT table, partition, partition_id, name FROM system.parts WHERE database = currentDatabase() ORDER BY table, name;
