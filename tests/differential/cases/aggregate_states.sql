-- AggregateFunction states: made with -State, merged by AggregatingMergeTree, read with -Merge
-- and finalizeAggregation.
CREATE TABLE src (day Date, user UInt64, amount Int32, page String) ENGINE = MergeTree ORDER BY day;
INSERT INTO src SELECT toDate(concat('2026-10-0', toString(1 + number % 3))), number % 7, toInt32(number % 11) - 5, toString(number % 5) FROM numbers(200);
CREATE TABLE daily (day Date, users AggregateFunction(uniq, UInt64), exact AggregateFunction(uniqExact, UInt64), total AggregateFunction(sum, Int32), hits AggregateFunction(count), lo AggregateFunction(min, Int32), hi AggregateFunction(max, Int32), mean AggregateFunction(avg, Int32), top AggregateFunction(argMax, String, Int32), cnt SimpleAggregateFunction(sum, UInt64)) ENGINE = AggregatingMergeTree ORDER BY day;
SYSTEM STOP MERGES daily;
INSERT INTO daily SELECT day, uniqState(user), uniqExactState(user), sumState(amount), countState(), minState(amount), maxState(amount), avgState(amount), argMaxState(page, amount), count() FROM src WHERE user < 4 GROUP BY day;
INSERT INTO daily SELECT day, uniqState(user), uniqExactState(user), sumState(amount), countState(), minState(amount), maxState(amount), avgState(amount), argMaxState(page, amount), count() FROM src WHERE user >= 4 GROUP BY day;
SELECT day, uniqMerge(users), uniqExactMerge(exact), sumMerge(total), countMerge(hits), minMerge(lo), maxMerge(hi), avgMerge(mean), sum(cnt) FROM daily GROUP BY day ORDER BY day;
SELECT day, finalizeAggregation(users), finalizeAggregation(total), finalizeAggregation(hits), cnt FROM daily FINAL ORDER BY day;
SELECT count() FROM system.parts WHERE database = currentDatabase() AND table = 'daily' AND active = 1;
SYSTEM START MERGES daily;
OPTIMIZE TABLE daily FINAL;
SELECT day, finalizeAggregation(users), finalizeAggregation(exact), finalizeAggregation(total), finalizeAggregation(hits), finalizeAggregation(lo), finalizeAggregation(hi), finalizeAggregation(mean), cnt FROM daily ORDER BY day;
SELECT uniq(user), uniqExact(user), sum(amount), count(), min(amount), max(amount), avg(amount) FROM src;
