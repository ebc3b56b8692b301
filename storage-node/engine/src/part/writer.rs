//! Writes one part from a stream of sorted batches.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use arrow::array::RecordBatch;
use arrow::compute::concat_batches;
use arrow::datatypes::SchemaRef;
use arrow::ipc::writer::FileWriter;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use crate::types::CH_TYPE_KEY;

use super::meta::{self, PartMeta, DATA_FILE, INDEX_FILE, META_FILE};
use super::{sync_dir, DataPart, PartName, TMP_PREFIX};
use crate::error::{EngineError, Result};
use crate::key_expr::Partition;

/// Rows per Parquet row group: large enough for good compression, small enough that a merge
/// or FINAL reading many parts at once holds little of each in memory.
pub const ROW_GROUP_ROWS: usize = 65_536;

pub struct PartWriter {
    table_dir: PathBuf,
    tmp_dir: PathBuf,
    writer: ArrowWriter<File>,
    key_columns: Vec<usize>,
    granularity: u64,
    rows: u64,
    index_rows: Vec<RecordBatch>,
    last_key: Option<RecordBatch>,
    partition: Partition,
    key_schema: SchemaRef,
}

/// How a column's values are laid out in the part's pages, before LZ4.
enum ColumnEncoding {
    Dictionary,
    Plain(Encoding),
}

/// Dictionary encoding pays off for LowCardinality columns; for the others building a
/// dictionary that overflows and is dropped costs a tenth of the write. An integer, date or
/// time column of the sorting key is sorted, or sorted within runs of the columns before
/// it, so its deltas are small: delta-packed it is a fraction of its LZ4 size and reads
/// without decompressing, which made a full read of a UInt64 key column three times faster.
/// Strings keep their lengths apart from their bytes, so that a read appends the bytes in
/// one piece rather than value by value.
fn column_encoding(field: &arrow::datatypes::Field, in_sorting_key: bool) -> ColumnEncoding {
    use arrow::datatypes::DataType;
    if field.metadata().get(CH_TYPE_KEY).is_some_and(|t| t.contains("LowCardinality")) {
        return ColumnEncoding::Dictionary;
    }
    match field.data_type() {
        t if in_sorting_key
            && (t.is_integer() || matches!(t, DataType::Date32 | DataType::Date64 | DataType::Timestamp(..))) =>
        {
            ColumnEncoding::Plain(Encoding::DELTA_BINARY_PACKED)
        }
        DataType::Utf8 | DataType::Binary => ColumnEncoding::Plain(Encoding::DELTA_LENGTH_BYTE_ARRAY),
        _ => ColumnEncoding::Plain(Encoding::PLAIN),
    }
}

impl PartWriter {
    /// Starts a part under `tmp_<tmp_name>`; its final name is given at [`finish`](Self::finish),
    /// once the commit has allocated its block numbers.
    pub fn create(
        table_dir: &Path,
        tmp_name: &str,
        partition: Partition,
        schema: SchemaRef,
        key_columns: Vec<usize>,
        granularity: u64,
    ) -> Result<PartWriter> {
        let tmp_dir = table_dir.join(format!("{TMP_PREFIX}{tmp_name}"));
        if tmp_dir.exists() {
            std::fs::remove_dir_all(&tmp_dir).map_err(EngineError::io(&tmp_dir))?;
        }
        std::fs::create_dir_all(&tmp_dir).map_err(EngineError::io(&tmp_dir))?;
        let data_path = tmp_dir.join(DATA_FILE);
        let file = File::create(&data_path).map_err(EngineError::io(&data_path))?;
        let mut props = WriterProperties::builder()
            .set_compression(Compression::LZ4_RAW)
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .set_statistics_enabled(EnabledStatistics::Page)
            .set_dictionary_enabled(false);
        for (i, field) in schema.fields().iter().enumerate() {
            let path = ColumnPath::from(field.name().as_str());
            props = match column_encoding(field, key_columns.contains(&i)) {
                ColumnEncoding::Dictionary => props.set_column_dictionary_enabled(path, true),
                ColumnEncoding::Plain(Encoding::PLAIN) => props,
                ColumnEncoding::Plain(encoding) => props.set_column_encoding(path, encoding),
            };
        }
        let props = props.build();
        let writer =
            ArrowWriter::try_new(file, schema.clone(), Some(props)).map_err(EngineError::parquet(&data_path))?;
        let key_schema = SchemaRef::new(schema.project(&key_columns)?);
        Ok(PartWriter {
            table_dir: table_dir.to_path_buf(),
            tmp_dir,
            writer,
            key_columns,
            granularity,
            rows: 0,
            index_rows: Vec::new(),
            last_key: None,
            partition,
            key_schema,
        })
    }

    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let keys = batch.project(&self.key_columns)?;
        let mut row = (self.granularity - self.rows % self.granularity) % self.granularity;
        while (row as usize) < batch.num_rows() {
            self.index_rows.push(keys.slice(row as usize, 1));
            row += self.granularity;
        }
        self.last_key = Some(keys.slice(batch.num_rows() - 1, 1));
        self.writer.write(batch).map_err(EngineError::parquet(self.tmp_dir.join(DATA_FILE)))?;
        self.rows += batch.num_rows() as u64;
        Ok(())
    }

    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Writes every batch of `batches` with the encoding on a thread of its own, so that the
    /// producer (a merge) and the Parquet encoder each keep a core busy. On an error of either
    /// side the unfinished part is removed.
    pub fn write_all_pipelined(self, batches: impl Iterator<Item = Result<RecordBatch>>) -> Result<PartWriter> {
        let (sender, receiver) = std::sync::mpsc::sync_channel::<RecordBatch>(4);
        let (writer, produced, written) = std::thread::scope(|scope| {
            let encoder = scope.spawn(move || {
                let mut writer = self;
                let mut result = Ok(());
                for batch in receiver {
                    result = writer.write(&batch);
                    if result.is_err() {
                        break;
                    }
                }
                (writer, result)
            });
            let mut produced = Ok(());
            for batch in batches {
                match batch {
                    Ok(batch) => {
                        if sender.send(batch).is_err() {
                            break; // the encoder stopped on an error, reported below
                        }
                    }
                    Err(e) => {
                        produced = Err(e);
                        break;
                    }
                }
            }
            drop(sender);
            let (writer, written) = encoder.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (writer, produced, written)
        });
        if let Err(e) = produced.and(written) {
            writer.abort();
            return Err(e);
        }
        Ok(writer)
    }

    pub fn partition(&self) -> &Partition {
        &self.partition
    }

    /// Removes the unfinished part.
    pub fn abort(self) {
        drop(self.writer);
        if let Err(e) = std::fs::remove_dir_all(&self.tmp_dir) {
            tracing::warn!(dir = %self.tmp_dir.display(), error = %e, "cannot remove an aborted part");
        }
    }

    /// Closes the files and fsyncs them; the part stays under its temporary name.
    pub fn close(mut self, dedup_id: Option<String>) -> Result<ClosedPart> {
        let data_path = self.tmp_dir.join(DATA_FILE);
        let file = self.writer.into_inner().map_err(EngineError::parquet(&data_path))?;
        file.sync_all().map_err(EngineError::io(&data_path))?;

        let mut index_batches = self.index_rows;
        index_batches.extend(self.last_key);
        let index = concat_batches(&self.key_schema, &index_batches)?;
        let index_path = self.tmp_dir.join(INDEX_FILE);
        write_ipc(&index_path, &index)?;

        let mut files = BTreeMap::new();
        for file in [DATA_FILE, INDEX_FILE] {
            files.insert(file.to_string(), meta::checksum_file(&self.tmp_dir.join(file))?);
        }
        let meta = PartMeta {
            format_version: meta::FORMAT_VERSION,
            partition: self.partition,
            rows: self.rows,
            index_granularity: self.granularity,
            dedup_id,
            modification_time: chrono::Utc::now().timestamp(),
            files,
        };
        let meta_path = self.tmp_dir.join(META_FILE);
        let json = serde_json::to_vec_pretty(&meta)
            .map_err(|source| EngineError::Metadata { path: meta_path.clone(), source })?;
        write_synced(&meta_path, &json)?;
        sync_dir(&self.tmp_dir)?;
        let tmp_dir = std::mem::take(&mut self.tmp_dir);
        Ok(ClosedPart { table_dir: self.table_dir, tmp_dir, meta, index })
    }
}

/// A part whose files are complete and durable under a temporary name.
pub struct ClosedPart {
    table_dir: PathBuf,
    tmp_dir: PathBuf,
    meta: PartMeta,
    index: RecordBatch,
}

impl ClosedPart {
    pub fn meta(&self) -> &PartMeta {
        &self.meta
    }

    /// Renames the part into place under its final name: the moment it exists.
    pub fn commit(self, name: PartName) -> Result<DataPart> {
        let final_dir = self.table_dir.join(name.to_string());
        std::fs::rename(&self.tmp_dir, &final_dir).map_err(EngineError::io(&final_dir))?;
        sync_dir(&self.table_dir)?;
        let bytes_on_disk = self.meta.files.values().map(|f| f.size).sum();
        Ok(DataPart {
            name,
            dir: final_dir,
            meta: self.meta,
            bytes_on_disk,
            index: self.index,
            outdated: Default::default(),
        })
    }

    /// Moves the part's directory to `dir` (inside the table directory), durably: a part
    /// prepared for a two-step commit lives there across restarts.
    pub fn move_to(mut self, dir: PathBuf) -> Result<ClosedPart> {
        std::fs::rename(&self.tmp_dir, &dir).map_err(EngineError::io(&dir))?;
        if let Some(parent) = dir.parent() {
            sync_dir(parent)?;
        }
        self.tmp_dir = dir;
        Ok(self)
    }

    /// A closed part found on disk under `dir` (a prepared insert after a restart).
    pub fn reopen(table_dir: &Path, dir: &Path) -> Result<ClosedPart> {
        let label = dir.display().to_string();
        let (meta, _, index) = super::verified_files(dir, &label)?;
        Ok(ClosedPart { table_dir: table_dir.to_path_buf(), tmp_dir: dir.to_path_buf(), meta, index })
    }

    pub fn abort(self) {
        if let Err(e) = std::fs::remove_dir_all(&self.tmp_dir) {
            tracing::warn!(dir = %self.tmp_dir.display(), error = %e, "cannot remove an aborted part");
        }
    }
}

fn write_ipc(path: &Path, batch: &RecordBatch) -> Result<()> {
    let file = File::create(path).map_err(EngineError::io(path))?;
    let mut writer = FileWriter::try_new(file, &batch.schema())?;
    writer.write(batch)?;
    writer.finish()?;
    let file = writer.into_inner()?;
    file.sync_all().map_err(EngineError::io(path))
}

pub fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut file = File::create(path).map_err(EngineError::io(path))?;
    file.write_all(bytes).map_err(EngineError::io(path))?;
    file.sync_all().map_err(EngineError::io(path))
}
