-- Column types, input and output formats, and the SQL surface users rely on.
CREATE TABLE ev (d Date, ts DateTime, ts3 DateTime64(3), id UInt64, name LowCardinality(String), amount Decimal(18, 4), score Nullable(Float64), tags Array(String), ok Bool, small Int8) ENGINE = MergeTree PARTITION BY toYYYYMM(d) ORDER BY (d, id);
INSERT INTO ev VALUES ('2026-10-01', '2026-10-01 10:00:00', '2026-10-01 10:00:00.123', 1, 'a', 1.5, NULL, ['x', 'y'], true, -1), ('2026-10-02', '2026-10-02 11:30:00', '2026-10-02 11:30:00.5', 2, 'b', 2.25, 0.5, [], false, 7);
INSERT INTO ev FORMAT JSONEachRow {"d": "2026-11-05", "ts": "2026-11-05 00:00:01", "ts3": "2026-11-05 00:00:01.000", "id": 3, "name": "a", "amount": "10", "score": 2.5, "tags": ["z"], "ok": true, "small": 3}
{"d": "2026-11-06", "ts": "2026-11-06 23:59:59", "ts3": "2026-11-06 23:59:59.999", "id": 4, "name": "c", "amount": 0.0001, "tags": [], "ok": false, "small": -128};
SELECT * FROM ev ORDER BY id;
SELECT * FROM ev ORDER BY id FORMAT TSVWithNames;
SELECT * FROM ev ORDER BY id FORMAT CSV;
SELECT * FROM ev ORDER BY id FORMAT JSONEachRow;
SELECT id, name, amount, score FROM ev ORDER BY id FORMAT PrettyCompact;
SELECT partition, name, rows FROM system.parts WHERE database = currentDatabase() AND table = 'ev' ORDER BY name;
SELECT toYYYYMM(d) AS m, count(), sum(amount), countIf(ok), sumIf(small, small > 0), uniqExact(name), min(ts), max(ts3) FROM ev GROUP BY m ORDER BY m;
SELECT toStartOfHour(ts) AS h, toDate(ts) AS day, toString(id) AS sid, toUInt64(small + 200) AS u FROM ev ORDER BY h;
SELECT name, argMax(id, ts) AS last_id, arraySort(groupArray(id)) AS ids FROM ev WHERE name != 'c' GROUP BY name ORDER BY name;
SELECT count() FROM ev WHERE d >= '2026-10-02' AND d < '2026-11-06';
SELECT id FROM ev WHERE score IS NULL ORDER BY id;
DESCRIBE TABLE ev;
CREATE TABLE n (k UInt64, v UInt64) ENGINE = SummingMergeTree ORDER BY k;
INSERT INTO n SELECT number % 10, number FROM numbers(1000);
SELECT k, sum(v) FROM n GROUP BY k HAVING sum(v) > 49500 ORDER BY k LIMIT 3;
SELECT k, v FROM n FINAL ORDER BY k DESC LIMIT 2;
SHOW TABLES;
DROP TABLE n;
SHOW TABLES;
SELECT number, number * 2 AS twice FROM numbers(3);
SELECT count(), sum(number), avg(number), min(number), max(number) FROM numbers(10);
SELECT 7 / 2, intDiv(7, 2), intDiv(-7, 2), 7 % 3, toDate('2026-10-30') + 3, toDate('2026-10-30') - 1, toDateTime('2026-10-30 00:00:00') + 61;
SELECT number, intDiv(number, 3), number / 4 FROM numbers(6) WHERE number % 2 = 0 ORDER BY number;
