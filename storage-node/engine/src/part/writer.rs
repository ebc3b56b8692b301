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
    encoder: Encoder,
    key_columns: Vec<usize>,
    granularity: u64,
    rows: u64,
    index_rows: Vec<RecordBatch>,
    last_key: Option<RecordBatch>,
    partition: Partition,
    key_schema: SchemaRef,
}

/// The Parquet writer, made once the part's first row group is at hand (or at its close):
/// those rows decide which columns are worth compressing.
enum Encoder {
    /// The data file (until the writer takes it), the part's schema and its first batches.
    Waiting {
        file: Option<File>,
        schema: SchemaRef,
        held: Vec<RecordBatch>,
        held_rows: usize,
        held_bytes: usize,
    },
    Writing(Box<ArrowWriter<File>>),
}

/// Bytes of a column's first row group that LZ4 is tried on, taken evenly from its batches
/// (the first batch of a merge alone can be unlike the rest) and compressed as one block, as
/// a page is. LZ4 (lz4_flex) finds more in blocks under 64 KiB than in larger ones (random
/// decimal strings: 18% off 32 KiB, 3% off 64 KiB, 7% off a page), so the probe is larger.
const PROBE_BYTES: usize = 128 << 10;

/// The most memory the batches held for the probe may take: wide rows start the writer
/// before a whole row group is at hand.
const HOLD_BYTES: usize = 16 << 20;

/// A column whose probe LZ4 shrinks by less than this share is written uncompressed: its
/// pages would cost a decompression at every read for next to no bytes saved. Decimal
/// strings of numbers, for one, shrink by 7%; without LZ4 a GROUP BY reading such a column
/// took 7-10% less CPU.
const MIN_LZ4_SAVING: f64 = 0.1;

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

/// Whether LZ4 pays for column `c` of `batches`, judged on samples of the values as a page
/// lays them out (the values of a primitive column, the bytes of a string column). Other
/// layouts are compressed.
fn lz4_pays(batches: &[RecordBatch], c: usize) -> bool {
    let share = PROBE_BYTES / batches.len().max(1);
    let mut sample = Vec::with_capacity(PROBE_BYTES);
    for batch in batches {
        let Some(values) = page_values(batch.column(c).as_ref()) else { return true };
        sample.extend_from_slice(&values.as_slice()[..values.len().min(share)]);
    }
    // Too little to judge by is compressed.
    sample.len() < 4096
        || (lz4_flex::block::compress(&sample).len() as f64) < sample.len() as f64 * (1.0 - MIN_LZ4_SAVING)
}

/// The bytes a page holds of a primitive or string column: only those of the array's own
/// rows, since a slice or a taken array may share a buffer with other rows.
fn page_values(column: &dyn arrow::array::Array) -> Option<arrow::buffer::Buffer> {
    use arrow::array::AsArray;
    use arrow::datatypes::DataType;
    let (values, offsets) = match column.data_type() {
        DataType::Utf8 => (column.as_string::<i32>().values(), column.as_string::<i32>().value_offsets()),
        DataType::Binary => (column.as_binary::<i32>().values(), column.as_binary::<i32>().value_offsets()),
        t => {
            let width = t.primitive_width()?;
            let data = column.to_data();
            let values = data.buffers().first()?;
            return Some(values.slice_with_length(data.offset() * width, data.len() * width));
        }
    };
    let (first, last) = (*offsets.first()? as usize, *offsets.last()? as usize);
    Some(values.slice_with_length(first, last - first))
}

/// The writer settings of a part: each column's encoding, and LZ4 for the columns that
/// `first` (the part's first batches) shows it pays for.
fn writer_properties(schema: &SchemaRef, key_columns: &[usize], first: &[RecordBatch]) -> WriterProperties {
    let mut props = WriterProperties::builder()
        .set_compression(Compression::LZ4_RAW)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_dictionary_enabled(false);
    for (i, field) in schema.fields().iter().enumerate() {
        let path = ColumnPath::from(field.name().as_str());
        let encoding = column_encoding(field, key_columns.contains(&i));
        // With no batch at all the probe has nothing to judge by, and keeps LZ4.
        let raw = matches!(encoding, ColumnEncoding::Plain(Encoding::PLAIN | Encoding::DELTA_LENGTH_BYTE_ARRAY))
            && !lz4_pays(first, i);
        if raw {
            props = props.set_column_compression(path.clone(), Compression::UNCOMPRESSED);
        }
        props = match encoding {
            ColumnEncoding::Dictionary => props.set_column_dictionary_enabled(path, true),
            ColumnEncoding::Plain(Encoding::PLAIN) => props,
            ColumnEncoding::Plain(encoding) => props.set_column_encoding(path, encoding),
        };
    }
    props.build()
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
        let key_schema = SchemaRef::new(schema.project(&key_columns)?);
        Ok(PartWriter {
            table_dir: table_dir.to_path_buf(),
            tmp_dir,
            encoder: Encoder::Waiting { file: Some(file), schema, held: Vec::new(), held_rows: 0, held_bytes: 0 },
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
        self.rows += batch.num_rows() as u64;
        match &mut self.encoder {
            Encoder::Waiting { held, held_rows, held_bytes, .. } => {
                held.push(batch.clone());
                *held_rows += batch.num_rows();
                *held_bytes += batch.get_array_memory_size();
                if *held_rows >= ROW_GROUP_ROWS || *held_bytes >= HOLD_BYTES {
                    self.start_writing()?;
                }
                Ok(())
            }
            Encoder::Writing(writer) => writer.write(batch).map_err(EngineError::parquet(self.tmp_dir.join(DATA_FILE))),
        }
    }

    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Makes the Parquet writer, with the batches held so far deciding each column's
    /// compression, and writes them.
    fn start_writing(&mut self) -> Result<()> {
        if let Encoder::Waiting { file, schema, held, .. } = &mut self.encoder {
            let data_path = self.tmp_dir.join(DATA_FILE);
            let file = file.take().ok_or_else(|| EngineError::Io {
                path: data_path.clone(),
                source: std::io::Error::other("the part's Parquet writer failed to start earlier"),
            })?;
            let held = std::mem::take(held);
            let props = writer_properties(schema, &self.key_columns, &held);
            let mut writer =
                ArrowWriter::try_new(file, schema.clone(), Some(props)).map_err(EngineError::parquet(&data_path))?;
            for batch in &held {
                writer.write(batch).map_err(EngineError::parquet(&data_path))?;
            }
            self.encoder = Encoder::Writing(Box::new(writer));
        }
        Ok(())
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
        drop(self.encoder);
        if let Err(e) = std::fs::remove_dir_all(&self.tmp_dir) {
            tracing::warn!(dir = %self.tmp_dir.display(), error = %e, "cannot remove an aborted part");
        }
    }

    /// Closes the files and fsyncs them; the part stays under its temporary name.
    pub fn close(mut self, dedup_id: Option<String>) -> Result<ClosedPart> {
        let data_path = self.tmp_dir.join(DATA_FILE);
        self.start_writing()?;
        let Encoder::Writing(writer) = self.encoder else { unreachable!("made above") };
        let file = writer.into_inner().map_err(EngineError::parquet(&data_path))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{ArrayRef, StringArray, UInt64Array};
    use arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    /// Decimal strings of pseudo-random numbers (SplitMix64): LZ4 finds next to nothing in them.
    fn digits(rows: usize, seed: u64) -> StringArray {
        let mix = |i: u64| {
            let mut z = i.wrapping_add(seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        (0..rows as u64).map(|i| Some((mix(i) % 10_000_000).to_string())).collect()
    }

    fn batch(rows: usize, seed: u64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::UInt64, false),
            Field::new("digits", DataType::Utf8, false),
            Field::new("words", DataType::Utf8, false),
        ]));
        let k: ArrayRef = Arc::new(UInt64Array::from_iter_values(seed..seed + rows as u64));
        let words: ArrayRef =
            Arc::new((0..rows).map(|i| Some(format!("customer-{}", i % 100))).collect::<StringArray>());
        RecordBatch::try_new(schema, vec![k, Arc::new(digits(rows, seed)), words]).expect("batch")
    }

    #[test]
    fn lz4_is_kept_for_the_columns_it_shrinks() {
        let batches = [batch(10_000, 0), batch(10_000, 10_000)];
        assert!(lz4_pays(&batches, 0), "consecutive integers");
        assert!(!lz4_pays(&batches, 1), "random decimal strings");
        assert!(lz4_pays(&batches, 2), "repeated words");
        assert!(lz4_pays(&[batch(100, 0)], 1), "too few bytes to judge: compressed");
    }

    #[test]
    fn a_probe_reads_only_the_rows_of_a_slice() {
        // A slice of repeated words inside a buffer of random digits, and the other way round.
        let mixed: StringArray =
            digits(20_000, 0).iter().chain(std::iter::repeat_n(Some("abcdefgh"), 20_000)).collect();
        let words = mixed.slice(20_000, 20_000);
        let digits_only = mixed.slice(0, 20_000);
        assert_eq!(page_values(&words).expect("bytes").len(), 8 * 20_000);
        let probe = |array: &StringArray| {
            let schema = Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8, false)]));
            lz4_pays(&[RecordBatch::try_new(schema, vec![Arc::new(array.clone())]).expect("batch")], 0)
        };
        assert!(probe(&words));
        assert!(!probe(&digits_only));
    }

    #[test]
    fn a_part_stores_incompressible_columns_raw_and_reads_back_the_same() {
        let dir = tempfile::tempdir().expect("tempdir");
        let batches: Vec<RecordBatch> = (0..10).map(|i| batch(8192, i * 8192)).collect();
        let schema = batches[0].schema();
        let mut writer =
            PartWriter::create(dir.path(), "t", Partition::all(), schema.clone(), vec![0], 8192).expect("writer");
        for b in &batches {
            writer.write(b).expect("write");
        }
        let closed = writer.close(None).expect("close");
        let path = closed.tmp_dir.join(DATA_FILE);
        let file = File::open(&path).expect("open");
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file).expect("reader");
        let codecs: Vec<Compression> =
            reader.metadata().row_group(0).columns().iter().map(|c| c.compression()).collect();
        assert_eq!(codecs, [Compression::LZ4_RAW, Compression::UNCOMPRESSED, Compression::LZ4_RAW]);
        let read: Vec<RecordBatch> =
            reader.build().expect("build").collect::<std::result::Result<_, _>>().expect("read");
        let read = concat_batches(&read[0].schema(), &read).expect("concat");
        let written = concat_batches(&schema, &batches).expect("concat");
        for c in 0..3 {
            assert_eq!(read.column(c).to_data(), written.column(c).to_data(), "column {c}");
        }
    }
}
