//! Table behaviour: recovery, readers holding outdated parts, pruning, insert limits.

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, RecordBatch, UInt64Array};
use arrow::datatypes::UInt64Type;

use super::*;
use crate::commit::{BoxFuture, Coordination, ExtraOp, LocalCommitters, Refusal};
use crate::schema::{EngineKind, TableDef};
use crate::settings::TableSettings;
use crate::types::ChType;

const LOCAL: LocalCommitters = LocalCommitters { coordination: None };

fn def(settings: TableSettings) -> TableDef {
    TableDef {
        settings,
        ..TableDef::for_tests("t", EngineKind::MergeTree, &[("k", ChType::UInt64), ("v", ChType::UInt64)])
    }
}

fn block(table: &Table, keys: std::ops::Range<u64>) -> RecordBatch {
    let k: ArrayRef = Arc::new(UInt64Array::from_iter_values(keys.clone()));
    let v: ArrayRef = Arc::new(UInt64Array::from_iter_values(keys.map(|x| x * 10)));
    RecordBatch::try_new(table.schema(), vec![k, v]).expect("block")
}

fn rows(streams: Vec<crate::merge::SortedStream>) -> u64 {
    streams.into_iter().flatten().map(|b| b.expect("batch").num_rows() as u64).sum()
}

#[test]
fn outdated_parts_stay_on_disk_while_a_reader_holds_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let table = Table::create(&dir.path().join("t"), def(TableSettings::default()), &LOCAL).expect("create");
    table.insert(block(&table, 0..10), &InsertOptions::default()).expect("insert");
    table.insert(block(&table, 10..20), &InsertOptions::default()).expect("insert");
    let reader = table.snapshot();
    table.optimize(&OptimizeRequest { final_merge: true, ..Default::default() }).expect("optimize");
    assert!(reader.iter().all(|p| p.is_outdated() && p.dir.exists()));
    let names: Vec<String> = table.parts_info().iter().filter(|p| p.active).map(|p| p.name.clone()).collect();
    assert_eq!(names, vec!["all_1_2_1"]);
    let old_dirs: Vec<_> = reader.iter().map(|p| p.dir.clone()).collect();
    drop(reader);
    table.remove_unused_outdated();
    assert!(old_dirs.iter().all(|d| !d.exists()));
}

#[test]
fn restart_drops_parts_covered_by_a_merge_and_temporary_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("t");
    let table = Table::create(&path, def(TableSettings::default()), &LOCAL).expect("create");
    table.insert(block(&table, 0..10), &InsertOptions::default()).expect("insert");
    table.insert(block(&table, 10..20), &InsertOptions::default()).expect("insert");
    let sources = table.snapshot();
    // A merge that finished writing its part but crashed before removing the sources.
    let copy = |from: &std::path::Path, to: &std::path::Path| {
        std::fs::create_dir_all(to).expect("mkdir");
        for entry in std::fs::read_dir(from).expect("read dir") {
            let entry = entry.expect("entry");
            std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy");
        }
    };
    table.optimize(&OptimizeRequest { final_merge: true, ..Default::default() }).expect("optimize");
    let saved = dir.path().join("saved");
    for part in &sources {
        copy(&part.dir, &saved.join(part.name.to_string()));
    }
    drop(sources);
    drop(table);
    for entry in std::fs::read_dir(&saved).expect("saved") {
        let entry = entry.expect("entry");
        copy(&entry.path(), &path.join(entry.file_name()));
    }
    std::fs::create_dir_all(path.join("tmp_insert_all_9")).expect("tmp");
    let reopened = Table::open(&path, &LOCAL).expect("reopen");
    let active: Vec<String> = reopened.parts_info().iter().map(|p| p.name.clone()).collect();
    assert_eq!(active, vec!["all_1_2_1"]);
    assert!(!path.join("tmp_insert_all_9").exists() && !path.join("all_1_1_0").exists());
    assert_eq!(rows(reopened.scan(&ReadOptions { columns: vec![0, 1], ..Default::default() }).expect("scan")), 20);
}

#[test]
fn primary_key_range_reads_only_matching_granules() {
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = TableSettings { index_granularity: 100, ..Default::default() };
    let table = Table::create(&dir.path().join("t"), def(settings), &LOCAL).expect("create");
    table.insert(block(&table, 0..10_000), &InsertOptions::default()).expect("insert");
    let bound = |v: u64, inclusive| KeyBound { value: Arc::new(UInt64Array::from(vec![v])), inclusive };
    let options = ReadOptions {
        columns: vec![0],
        key_range: Some(KeyRange { lower: Some(bound(5_050, true)), upper: Some(bound(5_120, false)) }),
        ..Default::default()
    };
    let batches: Vec<RecordBatch> =
        table.scan(&options).expect("scan").into_iter().flatten().map(|b| b.expect("b")).collect();
    let keys: Vec<u64> =
        batches.iter().flat_map(|b| b.column(0).as_primitive::<UInt64Type>().values().to_vec()).collect();
    // Granules 50 and 51 hold 5000..5199: two granules read instead of a hundred.
    assert_eq!(keys.len(), 200);
    assert_eq!((keys[0], keys[keys.len() - 1]), (5_000, 5_199));
}

#[test]
fn too_many_parts_fails_the_insert() {
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = TableSettings {
        parts_to_delay_insert: 2,
        parts_to_throw_insert: 3,
        max_delay_to_insert: 0,
        ..Default::default()
    };
    let table = Table::create(&dir.path().join("t"), def(settings), &LOCAL).expect("create");
    table.stop_merges();
    for i in 0..3 {
        table.insert(block(&table, i * 10..i * 10 + 10), &InsertOptions::default()).expect("insert");
    }
    let err = table.insert(block(&table, 100..110), &InsertOptions::default()).expect_err("too many parts");
    assert!(matches!(err, EngineError::TooManyParts { parts: 3, .. }), "{err}");
}

#[test]
fn final_split_into_key_ranges_equals_one_merge() {
    use crate::schema::EngineKind;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut definition = def(TableSettings { index_granularity: 1000, ..Default::default() });
    definition.engine = EngineKind::ReplacingMergeTree { version: Some("v".into()), is_deleted: None };
    let table = Table::create(&dir.path().join("t"), definition, &LOCAL).expect("create");
    table.stop_merges();
    // Three overlapping parts with every key repeated, and one part beyond them.
    for (offset, step) in [(0u64, 3u64), (1, 2), (0, 1)] {
        let keys: Vec<u64> = (0..100_000u64).map(|i| (i * step + offset) % 120_000).collect();
        let k: ArrayRef = Arc::new(UInt64Array::from(keys.clone()));
        let v: ArrayRef = Arc::new(UInt64Array::from_iter_values(keys.iter().map(|x| x % 7 + step)));
        table
            .insert(RecordBatch::try_new(table.schema(), vec![k, v]).expect("block"), &InsertOptions::default())
            .expect("insert");
    }
    table.insert(block(&table, 500_000..520_000), &InsertOptions::default()).expect("insert");
    let options = ReadOptions { columns: vec![0, 1], ..Default::default() };
    let collect = |tasks: Vec<FinalTask>| -> Vec<(u64, u64)> {
        tasks
            .into_iter()
            .flat_map(FinalTask::into_stream)
            .flat_map(|b| {
                let b = b.expect("batch");
                let k = b.column(0).as_primitive::<UInt64Type>().values().to_vec();
                let v = b.column(1).as_primitive::<UInt64Type>().values().to_vec();
                k.into_iter().zip(v).collect::<Vec<_>>()
            })
            .collect()
    };
    let single = collect(table.plan_final(&options, 1).expect("plan"));
    let tasks = table.plan_final(&options, 3).expect("plan");
    assert_eq!(tasks.len(), 3);
    let split = collect(tasks);
    assert_eq!(split.len(), single.len());
    assert_eq!(split, single);
    assert!(split.windows(2).all(|w| w[0].0 < w[1].0), "one row per key, in key order");
}

#[test]
fn a_prepared_insert_is_invisible_until_committed_and_survives_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("t");
    let table = Table::create(&path, def(TableSettings::default()), &LOCAL).expect("create");
    let options = InsertOptions { deduplication_token: Some("p-t-0-9".into()), ..Default::default() };
    let first = table.prepare_insert(block(&table, 0..10), &options, "offset 10").expect("prepare");
    table.prepare_insert(block(&table, 10..15), &InsertOptions::default(), "offset 15").expect("prepare");
    assert!(table.parts_info().is_empty(), "prepared parts are not visible");
    table.abort_prepared(first);
    drop(table);

    // After a restart the one still prepared is found with its record, and can be committed.
    let table = Table::open(&path, &LOCAL).expect("reopen");
    assert!(table.parts_info().is_empty());
    let mut prepared = table.prepared_inserts().expect("list");
    assert_eq!(prepared.len(), 1);
    assert_eq!((prepared[0].record.context.as_str(), prepared[0].record.rows), ("offset 15", 5));
    let summary = table.commit_prepared(prepared.remove(0)).expect("commit");
    assert_eq!(summary.parts, vec!["all_1_1_0"]);
    assert!(table.prepared_inserts().expect("list").is_empty());
    assert_eq!(rows(table.scan(&ReadOptions::default()).expect("scan")), 5);
}

#[test]
fn optimize_waits_for_an_insert_holding_a_block_inside_the_partition() {
    let dir = tempfile::tempdir().expect("tempdir");
    let table = Arc::new(Table::create(&dir.path().join("t"), def(TableSettings::default()), &LOCAL).expect("create"));
    for i in 0..3 {
        table.insert(block(&table, i * 10..i * 10 + 10), &InsertOptions::default()).expect("insert");
    }
    // Block 2 belongs to an insert still in flight: a merge of 1 and 3 would cover it.
    table.lock_state().active.retain(|p| p.name.min_block != 2);
    let held = Reservation { partition_id: "all".into(), block: 2, dedup_id: None };
    table.hold_block(&held);
    let optimize = {
        let table = table.clone();
        std::thread::spawn(move || table.optimize(&OptimizeRequest { final_merge: true, ..Default::default() }))
    };
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(!optimize.is_finished(), "OPTIMIZE waits for block 2");
    assert_eq!(table.parts_info().len(), 2);
    table.release_block(&held);
    optimize.join().expect("thread").expect("optimize");
    let active: Vec<String> = table.parts_info().into_iter().filter(|p| p.active).map(|p| p.name).collect();
    assert_eq!(active, ["all_1_3_1"]);
}

/// The storage node's coordinator as the engine sees it, answering as told.
struct Answering(Result<Vec<i32>>);

impl Coordination for Answering {
    fn apply<'a>(&'a self, ops: &'a [ExtraOp]) -> BoxFuture<'a, Result<Vec<i32>>> {
        let answer = match &self.0 {
            Ok(versions) => Ok(versions.clone()),
            Err(_) => Err(EngineError::CommitRefused { path: ops[0].path().to_string(), refusal: Refusal::BadVersion }),
        };
        Box::pin(async move { answer })
    }
}

fn table_answering(dir: &Path, answer: Result<Vec<i32>>) -> Arc<Table> {
    let committers = LocalCommitters { coordination: Some(Arc::new(Answering(answer))) };
    let settings = TableSettings { non_replicated_deduplication_window: 100, ..Default::default() };
    Arc::new(Table::create(&dir.join("t"), def(settings), &committers).expect("create"))
}

fn offset_op() -> Vec<ExtraOp> {
    vec![ExtraOp::SetData { path: "/offsets/p/0".into(), data: b"10".to_vec(), expected_version: 3 }]
}

#[tokio::test]
async fn a_prepared_insert_commits_with_its_extra_ops() {
    let dir = tempfile::tempdir().expect("tempdir");
    let table = table_answering(dir.path(), Ok(vec![4]));
    let options = InsertOptions { deduplication_token: Some("p-t-0-9".into()), ..Default::default() };
    let prepared = table.prepare_insert(block(&table, 0..10), &options, "offset 10").expect("prepare");
    let (summary, outcome) = table.commit_prepared_with(prepared, offset_op(), None).await.expect("commit");
    assert_eq!((summary.parts, outcome.versions), (vec!["all_1_1_0".to_string()], vec![4]));
    assert!(table.prepared_inserts().expect("list").is_empty());

    // The same token again: the part is a duplicate, and the extra ops still commit.
    let again = table.prepare_insert(block(&table, 0..10), &options, "offset 10").expect("prepare");
    let (summary, outcome) = table.commit_prepared_with(again, offset_op(), None).await.expect("commit");
    assert_eq!((summary.parts.len(), summary.deduplicated, outcome.versions), (0, 1, vec![4]));
}

#[tokio::test]
async fn a_refused_commit_hands_the_prepared_insert_back_and_activates_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let refusing = Err(EngineError::Coordinator("refused".into()));
    let table = table_answering(dir.path(), refusing);
    let options = InsertOptions { deduplication_token: Some("p-t-0-9".into()), ..Default::default() };
    let prepared = table.prepare_insert(block(&table, 0..10), &options, "offset 10").expect("prepare");
    let Err(PreparedCommitError::Uncommitted { prepared, error }) =
        table.commit_prepared_with(prepared, offset_op(), None).await
    else {
        panic!("the commit is refused");
    };
    assert!(matches!(error, EngineError::CommitRefused { refusal: Refusal::BadVersion, .. }), "{error}");
    assert!(table.parts_info().is_empty(), "nothing is visible");
    assert!(table.lock_state().reserved_blocks.is_empty(), "the block is given up");
    // The dedup id is free again: committing the prepared insert now (the caller learnt the
    // commit happened after all) makes its part active.
    let t = table.clone();
    let summary =
        tokio::task::spawn_blocking(move || t.commit_prepared(prepared)).await.expect("task").expect("commit");
    assert_eq!(summary.parts, vec!["all_2_2_0"]);
}

#[test]
fn an_empty_part_in_place_of_a_lost_one_is_read_merged_and_reopened() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("t");
    let table = Table::create(&path, def(TableSettings::default()), &LOCAL).expect("create");
    table.insert(block(&table, 0..10), &InsertOptions::default()).expect("insert");
    let lost = PartName::parse("all_5_5_0").expect("name");
    table.create_empty_part(&lost).expect("empty part");
    table.create_empty_part(&lost).expect("a second time: already there, nothing to do");
    let parts: Vec<(String, u64)> = table.parts_info().iter().map(|p| (p.name.clone(), p.rows)).collect();
    assert_eq!(parts, vec![("all_1_1_0".to_string(), 10), ("all_5_5_0".to_string(), 0)]);
    let all_columns = ReadOptions { columns: vec![0, 1], ..Default::default() };
    assert_eq!(rows(table.scan(&all_columns).expect("scan")), 10);
    drop(table);
    let table = Table::open(&path, &LOCAL).expect("reopen");
    assert_eq!(table.parts_info().len(), 2, "the empty part is a part like the others after a restart");
    table.optimize(&OptimizeRequest { final_merge: true, ..Default::default() }).expect("optimize");
    let parts: Vec<(String, u64)> = table.parts_info().iter().map(|p| (p.name.clone(), p.rows)).collect();
    assert_eq!(parts, vec![("all_1_5_1".to_string(), 10)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parts_detached_for_a_restore_are_attached_back_in_insertion_order_under_new_blocks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let table = Arc::new(Table::create(&dir.path().join("t"), def(TableSettings::default()), &LOCAL).expect("create"));
    for range in [0..10, 10..15, 15..30] {
        let t = table.clone();
        tokio::task::spawn_blocking(move || t.insert(block(&t, range), &InsertOptions::default()).expect("insert"))
            .await
            .expect("insert task");
    }
    let t = table.clone();
    let (detached, pending) =
        tokio::task::spawn_blocking(move || (t.detach_all_for_restore().expect("detach"), t.detached_for_restore()))
            .await
            .expect("detach task");
    let pending = pending.expect("list");
    assert_eq!(detached, 3);
    assert!(table.snapshot().is_empty(), "the table is empty while its parts are detached");
    let names: Vec<String> =
        pending.iter().map(|p| p.file_name().expect("name").to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["restore_all_1_1_0", "restore_all_2_2_0", "restore_all_3_3_0"]);
    let mut attached = Vec::new();
    for dir in pending {
        attached.push(table.attach_detached(dir).await.expect("attach"));
    }
    use crate::table::attach::Attached;
    let expected = ["all_4_4_0", "all_5_5_0", "all_6_6_0"].map(|n| Attached::As(n.to_string()));
    assert_eq!(attached, expected);
    let sizes: Vec<u64> = table.snapshot().iter().map(|p| p.meta.rows).collect();
    assert_eq!(sizes, [10, 5, 15], "each part kept its rows, in the order they were inserted");
    let t = table.clone();
    assert!(tokio::task::spawn_blocking(move || t.detached_for_restore())
        .await
        .expect("task")
        .expect("list")
        .is_empty());
}

#[test]
fn reads_and_merges_count_what_they_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let table = Table::create(&dir.path().join("t"), def(TableSettings::default()), &LOCAL).expect("create");
    table.insert(block(&table, 0..10), &InsertOptions::default()).expect("insert");
    table.insert(block(&table, 10..30), &InsertOptions::default()).expect("insert");
    let progress = Arc::new(crate::progress::ReadProgress::default());
    let options = ReadOptions { columns: vec![0, 1], progress: Some(progress.clone()), ..Default::default() };
    assert_eq!(rows(table.scan(&options).expect("scan")), 30);
    let scanned = progress.counts();
    assert_eq!(scanned.rows, 30);
    assert!(scanned.bytes >= 30 * 16, "{scanned:?}");

    progress.reset();
    table
        .optimize(&OptimizeRequest { final_merge: true, progress: Some(progress.clone()), ..Default::default() })
        .expect("optimize");
    assert_eq!(progress.counts().rows, 30);

    progress.reset();
    assert_eq!(rows(table.scan(&ReadOptions { columns: vec![0, 1], ..Default::default() }).expect("scan")), 30);
    assert_eq!(progress.counts().rows, 0, "a read without the statement's progress counts nothing into it");
}
