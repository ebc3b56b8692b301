"""Random scenarios per engine: keys with many duplicates, version ties inside and across
parts, NaN and negative versions, tombstones, out-of-order sign rows, zero sums, partitions,
STOP MERGES, OPTIMIZE FINAL (with CLEANUP), and FINAL with predicates.

Every query orders its output completely, so ClickHouse and mergestream must agree exactly.
"""

import random

ENGINES = [
    "MergeTree",
    "ReplacingMergeTree",
    "ReplacingMergeTreeDeleted",
    "SummingMergeTree",
    "AggregatingMergeTree",
    "CollapsingMergeTree",
    "VersionedCollapsingMergeTree",
    "CoalescingMergeTree",
]


def _lit(value):
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, float):
        return "nan" if value != value else repr(value)
    return str(value)


class Scenario:
    def __init__(self, engine: str, seed: int):
        self.rng = random.Random(f"{engine}:{seed}")
        self.engine = engine
        self.keys = self.rng.randint(1, 6)
        self.partitioned = self.rng.random() < 0.4

    def key(self):
        return self.rng.randrange(self.keys)

    def word(self):
        return self.rng.choice(["a", "b", "c", "", "x y", "it's"])

    def schema(self):
        r = self.rng
        e = self.engine
        if e == "MergeTree":
            return "(k UInt8, v Int32, s String)", "MergeTree", lambda: (self.key(), r.randint(-3, 3), self.word())
        if e == "ReplacingMergeTree":
            ver_type = r.choice(["UInt32", "Int32", "Float64", None])
            if ver_type is None:
                return "(k UInt8, v Int32, s String)", "ReplacingMergeTree", lambda: (self.key(), r.randint(-3, 3), self.word())

            def version():
                if ver_type == "UInt32":
                    return r.randint(0, 3)
                if ver_type == "Int32":
                    return r.randint(-3, 3)
                return r.choice([0.0, 1.5, -2.0, float("nan"), 3.0])

            return (
                f"(k UInt8, ver {ver_type}, s String)",
                "ReplacingMergeTree(ver)",
                lambda: (self.key(), version(), self.word()),
            )
        if e == "ReplacingMergeTreeDeleted":
            return (
                "(k UInt8, ver UInt16, is_deleted UInt8, s String)",
                "ReplacingMergeTree(ver, is_deleted)",
                lambda: (self.key(), r.randint(0, 4), int(r.random() < 0.3), self.word()),
            )
        if e == "SummingMergeTree":
            listed = r.random() < 0.3
            engine = "SummingMergeTree((a))" if listed else "SummingMergeTree"
            return (
                "(k UInt8, a Int32, b UInt16, s String)",
                engine,
                lambda: (self.key(), r.choice([0, 0, 1, -1, 5, -5]), r.choice([0, 0, 1, 2]), self.word()),
            )
        if e == "AggregatingMergeTree":
            return (
                "(k UInt8, mx SimpleAggregateFunction(max, Int32), mn SimpleAggregateFunction(min, Int32), "
                "sm SimpleAggregateFunction(sum, UInt64), an SimpleAggregateFunction(any, String), "
                "al SimpleAggregateFunction(anyLast, String))",
                "AggregatingMergeTree",
                lambda: (self.key(), r.randint(-9, 9), r.randint(-9, 9), r.randint(0, 9), self.word(), self.word()),
            )
        if e == "CollapsingMergeTree":
            return (
                "(k UInt8, v UInt8, sign Int8)",
                "CollapsingMergeTree(sign)",
                lambda: (self.key(), r.randint(0, 2), r.choice([1, -1])),
            )
        if e == "VersionedCollapsingMergeTree":
            return (
                "(k UInt8, v UInt8, sign Int8, ver UInt8)",
                "VersionedCollapsingMergeTree(sign, ver)",
                lambda: (self.key(), r.randint(0, 2), r.choice([1, -1]), r.randint(0, 2)),
            )
        if e == "CoalescingMergeTree":
            return (
                "(k UInt8, a Nullable(Int32), b Nullable(String))",
                "CoalescingMergeTree",
                lambda: (self.key(), r.choice([None, None, 1, 2, -3]), r.choice([None, "p", "q"])),
            )
        raise ValueError(e)

    def script(self) -> str:
        r = self.rng
        columns, engine, row = self.schema()
        names = [c.strip().split(" ")[0] for c in columns.strip("()").split(", ") if c.strip() and not c.strip()[0].isupper() and " " in c.strip()]
        order = ", ".join(names)
        settings = ""
        cleanup = self.engine == "ReplacingMergeTreeDeleted" and r.random() < 0.5
        if cleanup:
            settings = " SETTINGS allow_experimental_replacing_merge_with_cleanup = 1"
        partition = " PARTITION BY k % 2" if self.partitioned else ""
        out = [f"CREATE TABLE t {columns} ENGINE = {engine}{partition} ORDER BY k{settings}", "SYSTEM STOP MERGES t"]
        for _ in range(r.randint(1, 5)):
            rows = [row() for _ in range(r.randint(1, 8))]
            out.append("INSERT INTO t VALUES " + ", ".join("(" + ", ".join(_lit(v) for v in vals) + ")" for vals in rows))
        out.append(f"SELECT _part, {order} FROM t ORDER BY _part, {order}")
        out.append("SELECT partition, name, rows, level, min_block_number, max_block_number FROM system.parts "
                   "WHERE database = currentDatabase() AND table = 't' AND active = 1 ORDER BY name")
        final = self.engine != "MergeTree"
        if final:
            out.append(f"SELECT {order} FROM t FINAL ORDER BY {order}")
            out.append("SELECT count() FROM t FINAL")
            out.append(f"SELECT {order} FROM t FINAL WHERE k >= {r.randrange(self.keys)} ORDER BY {order}")
            if self.partitioned:
                out.append(f"SELECT {order} FROM t FINAL ORDER BY {order} "
                           "SETTINGS do_not_merge_across_partitions_select_final = 1")
        out.append("SYSTEM START MERGES t")
        out.append("OPTIMIZE TABLE t FINAL" + (" CLEANUP" if cleanup and r.random() < 0.7 else ""))
        out.append(f"SELECT _part, {order} FROM t ORDER BY _part, {order}")
        if final:
            out.append(f"SELECT {order} FROM t FINAL ORDER BY {order}")
        return ";\n".join(out) + ";\n"
