//! The merging algorithms on small hand-made inputs: each test is one rule of the seeds.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, Float64Array, Int32Array, Int8Array, RecordBatch, UInt64Array, UInt8Array,
};
use arrow::datatypes::{Float64Type, Int32Type, UInt64Type, UInt8Type};

use super::*;
use crate::schema::{EngineKind, TableDef};
use crate::types::ChType;

fn table(engine: EngineKind, columns: &[(&str, ChType)]) -> TableDef {
    TableDef::for_tests("t", engine, columns)
}

/// Merges `parts` (each a list of columns) and returns the output batches concatenated.
fn merge(def: &TableDef, parts: Vec<Vec<ArrayRef>>, options: AlgorithmOptions, leveled: bool) -> RecordBatch {
    let schema = def.arrow_schema();
    let key: Vec<usize> = def.sorting_key().iter().map(|k| def.column_index(k).expect("key")).collect();
    let sources = parts
        .into_iter()
        .map(|columns| {
            let batch = RecordBatch::try_new(schema.clone(), columns).expect("batch");
            (Box::new(std::iter::once(Ok(batch))) as SortedStream, leveled)
        })
        .collect();
    let algorithm = build_algorithm(def, &schema, options).expect("algorithm");
    let merge = SortedMerge::new(schema.clone(), key, sources, algorithm).expect("merge");
    let batches: Vec<RecordBatch> = merge.map(|b| b.expect("batch")).collect();
    arrow::compute::concat_batches(&schema, &batches).expect("concat")
}

fn u64s(v: &[u64]) -> ArrayRef {
    Arc::new(UInt64Array::from(v.to_vec()))
}

fn col_u64(batch: &RecordBatch, i: usize) -> Vec<u64> {
    batch.column(i).as_primitive::<UInt64Type>().values().to_vec()
}

#[test]
fn replacing_keeps_highest_version_and_last_row_on_ties() {
    let def = table(
        EngineKind::ReplacingMergeTree { version: Some("ver".into()), is_deleted: None },
        &[("k", ChType::UInt64), ("ver", ChType::UInt64), ("tag", ChType::UInt64)],
    );
    let out = merge(
        &def,
        vec![
            vec![u64s(&[1, 1, 2]), u64s(&[5, 7, 3]), u64s(&[10, 11, 12])],
            vec![u64s(&[1, 2]), u64s(&[7, 2]), u64s(&[20, 21])],
        ],
        AlgorithmOptions::default(),
        false,
    );
    assert_eq!(col_u64(&out, 0), vec![1, 2]);
    // Key 1: version 7 twice, the newer part wins; key 2: version 3 beats 2.
    assert_eq!(col_u64(&out, 2), vec![20, 12]);
}

#[test]
fn replacing_orders_nan_above_every_version() {
    let def = table(
        EngineKind::ReplacingMergeTree { version: Some("ver".into()), is_deleted: None },
        &[("k", ChType::UInt64), ("ver", ChType::Float64)],
    );
    let versions: ArrayRef = Arc::new(Float64Array::from(vec![f64::NAN, 1e300, -1.0]));
    let out = merge(&def, vec![vec![u64s(&[1, 1, 1]), versions]], AlgorithmOptions::default(), false);
    assert!(out.column(1).as_primitive::<Float64Type>().value(0).is_nan());
}

#[test]
fn replacing_cleanup_drops_tombstones_only_when_asked() {
    let def = table(
        EngineKind::ReplacingMergeTree { version: Some("ver".into()), is_deleted: Some("d".into()) },
        &[("k", ChType::UInt64), ("ver", ChType::UInt64), ("d", ChType::UInt8)],
    );
    let parts =
        || vec![vec![u64s(&[1, 1, 2]), u64s(&[1, 2, 1]), Arc::new(UInt8Array::from(vec![0u8, 1, 0])) as ArrayRef]];
    let kept = merge(&def, parts(), AlgorithmOptions::default(), false);
    assert_eq!(col_u64(&kept, 0), vec![1, 2]);
    assert_eq!(kept.column(2).as_primitive::<UInt8Type>().value(0), 1);
    let cleaned = merge(&def, parts(), AlgorithmOptions { cleanup: true, final_read: false }, false);
    assert_eq!(col_u64(&cleaned, 0), vec![2]);
}

fn signs(v: &[i8]) -> ArrayRef {
    Arc::new(Int8Array::from(v.to_vec()))
}

fn collapsing() -> TableDef {
    table(
        EngineKind::CollapsingMergeTree { sign: "sign".into() },
        &[("k", ChType::UInt64), ("v", ChType::UInt64), ("sign", ChType::Int8)],
    )
}

#[test]
fn collapsing_follows_the_four_rules() {
    let def = collapsing();
    let run = |v: &[u64], s: &[i8]| {
        merge(&def, vec![vec![u64s(&vec![1; v.len()]), u64s(v), signs(s)]], AlgorithmOptions::default(), false)
    };
    // Equal counts, last positive: first negative and last positive.
    let out = run(&[1, 2], &[-1, 1]);
    assert_eq!(col_u64(&out, 1), vec![1, 2]);
    // Equal counts, last negative: nothing.
    assert_eq!(run(&[1, 2], &[1, -1]).num_rows(), 0);
    // More positives: the last positive.
    assert_eq!(col_u64(&run(&[1, 2, 3], &[-1, 1, 1]), 1), vec![3]);
    // More negatives: the first negative.
    assert_eq!(col_u64(&run(&[1, 2, 3], &[-1, -1, 1]), 1), vec![1]);
}

#[test]
fn collapsing_final_hides_negative_rows() {
    let def = collapsing();
    let out = merge(
        &def,
        vec![vec![u64s(&[1, 1]), u64s(&[1, 2]), signs(&[-1, 1])]],
        AlgorithmOptions { cleanup: true, final_read: true },
        false,
    );
    assert_eq!(col_u64(&out, 1), vec![2]);
}

#[test]
fn collapsing_treats_rows_of_one_merged_part_as_different_keys() {
    // ClickHouse's rowsHaveDifferentSortColumns: part A (level 1) holds a -1/+1 pair.
    let def = collapsing();
    let out = merge(
        &def,
        vec![vec![u64s(&[1, 1]), u64s(&[0, 1]), signs(&[-1, 1])], vec![u64s(&[1]), u64s(&[2]), signs(&[1])]],
        AlgorithmOptions::default(),
        true,
    );
    assert_eq!(col_u64(&out, 1), vec![0, 2]);
}

#[test]
fn versioned_collapsing_matches_pairs_in_any_order() {
    let def = table(
        EngineKind::VersionedCollapsingMergeTree { sign: "sign".into(), version: "ver".into() },
        &[("k", ChType::UInt64), ("sign", ChType::Int8), ("ver", ChType::UInt64)],
    );
    let out = merge(
        &def,
        vec![vec![u64s(&[1, 2]), signs(&[-1, 1]), u64s(&[1, 1])], vec![u64s(&[1, 2]), signs(&[1, 1]), u64s(&[1, 2])]],
        AlgorithmOptions::default(),
        false,
    );
    // Key 1 version 1 cancelled although the -1 came first; key 2 has two versions.
    assert_eq!(col_u64(&out, 0), vec![2, 2]);
}

#[test]
fn summing_adds_numbers_keeps_first_other_value_and_drops_zero_rows() {
    let def = table(
        EngineKind::SummingMergeTree { columns: None },
        &[("k", ChType::UInt64), ("a", ChType::Int32), ("title", ChType::String)],
    );
    let ints = |v: &[i32]| Arc::new(Int32Array::from(v.to_vec())) as ArrayRef;
    let strings = |v: &[&str]| Arc::new(arrow::array::StringArray::from(v.to_vec())) as ArrayRef;
    let out = merge(
        &def,
        vec![
            vec![u64s(&[1, 2]), ints(&[5, 7]), strings(&["first", "x"])],
            vec![u64s(&[1, 2]), ints(&[3, -7]), strings(&["second", "y"])],
        ],
        AlgorithmOptions::default(),
        false,
    );
    // Key 2 sums to zero and disappears; key 1 keeps the first title.
    assert_eq!(col_u64(&out, 0), vec![1]);
    assert_eq!(out.column(1).as_primitive::<Int32Type>().values().to_vec(), vec![8]);
    assert_eq!(out.column(2).as_string::<i32>().value(0), "first");
}

#[test]
fn coalescing_takes_the_latest_non_null_value() {
    let def = table(
        EngineKind::CoalescingMergeTree,
        &[("k", ChType::UInt64), ("a", ChType::Nullable(Box::new(ChType::Int32)))],
    );
    let a = |v: Vec<Option<i32>>| Arc::new(Int32Array::from(v)) as ArrayRef;
    let out = merge(
        &def,
        vec![vec![u64s(&[1]), a(vec![Some(1)])], vec![u64s(&[1]), a(vec![Some(3)])], vec![u64s(&[1]), a(vec![None])]],
        AlgorithmOptions::default(),
        false,
    );
    let column = out.column(1).as_primitive::<Int32Type>();
    assert_eq!((column.len(), column.value(0), column.is_null(0)), (1, 3, false));
}

#[test]
fn large_merges_stream_in_bounded_batches() {
    let def = table(EngineKind::ReplacingMergeTree { version: None, is_deleted: None }, &[("k", ChType::UInt64)]);
    let keys: Vec<u64> = (0..50_000).collect();
    let out_batches = {
        let schema = def.arrow_schema();
        let sources = (0..3)
            .map(|_| {
                let batches: Vec<Result<RecordBatch>> = keys
                    .chunks(1000)
                    .map(|c| Ok(RecordBatch::try_new(schema.clone(), vec![u64s(c)]).expect("batch")))
                    .collect();
                (Box::new(batches.into_iter()) as SortedStream, true)
            })
            .collect();
        let algorithm = build_algorithm(&def, &schema, AlgorithmOptions::default()).expect("algorithm");
        SortedMerge::new(schema, vec![0], sources, algorithm)
            .expect("merge")
            .map(|b| b.expect("b").num_rows())
            .collect::<Vec<_>>()
    };
    assert_eq!(out_batches.iter().sum::<usize>(), 50_000);
    assert!(out_batches.iter().all(|&n| n <= MERGE_BLOCK_ROWS + 1));
}
