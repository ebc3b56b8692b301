//! Bulk ingest (CommandStatementIngest through DoPut, what ADBC's `adbc_ingest` sends): the
//! batches go into an existing table through the insert path of INSERT and the Ingest service
//! (columns matched by name, DEFAULTs, deduplication, the table's committer), in blocks of
//! ClickHouse's `max_insert_block_size` rows cut from the row stream, so that memory is bounded
//! and a retry cuts the same blocks however the client batches them.
//!
//! A client-given token (the `insert_deduplication_token` option, or the transaction id) makes
//! a retried DoPut idempotent: block n is inserted with the token `<token>_<n>`, as ClickHouse
//! extends a token over the blocks of one insert.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::compute::concat_batches;
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::error::FlightError;
use arrow_flight::sql::server::PeekableFlightDataStream;
use arrow_flight::sql::CommandStatementIngest;
use arrow_flight::sql::{TableExistsOption, TableNotExistOption};
use futures::{StreamExt, TryStreamExt};
use mergestream_engine::catalog::DATABASE;
use mergestream_engine::{Catalog, InsertOptions, Table};
use mergestream_query::session::{CATALOG_NAME, MAX_INSERT_BLOCK_ROWS};
use tonic::Status;

use crate::ingest::blocking;
use crate::status::status_of;

/// The option naming the insert's deduplication token, as the ClickHouse setting is named.
pub const TOKEN_OPTION: &str = "insert_deduplication_token";

/// Inserts the DoPut's batches into the command's table; how many rows were sent.
pub async fn ingest(
    catalog: &Arc<Catalog>,
    command: CommandStatementIngest,
    data: PeekableFlightDataStream,
) -> Result<i64, Status> {
    let table = target_table(catalog, &command)?;
    let token = token_of(&command)?;
    let mut batches = FlightRecordBatchStream::new_from_flight_data(data.map_err(|e| FlightError::Tonic(Box::new(e))));
    let mut pending: Vec<RecordBatch> = Vec::new();
    let (mut pending_rows, mut sent, mut block) = (0usize, 0i64, 0usize);
    while let Some(batch) = batches.next().await {
        let batch = batch.map_err(|e| Status::invalid_argument(format!("the ingested Arrow stream: {e}")))?;
        let t = table.clone();
        let batch = blocking(move || mergestream_query::input::conform_block(&t, &batch)).await?.map_err(status_of)?;
        sent += batch.num_rows() as i64;
        pending_rows += batch.num_rows();
        pending.push(batch);
        while pending_rows >= MAX_INSERT_BLOCK_ROWS {
            let all = concat(&table, std::mem::take(&mut pending))?;
            insert(catalog, &table, all.slice(0, MAX_INSERT_BLOCK_ROWS), &token, block).await?;
            block += 1;
            pending_rows -= MAX_INSERT_BLOCK_ROWS;
            if pending_rows > 0 {
                pending.push(all.slice(MAX_INSERT_BLOCK_ROWS, pending_rows));
            }
        }
    }
    if pending_rows > 0 {
        let all = concat(&table, pending)?;
        insert(catalog, &table, all, &token, block).await?;
    }
    Ok(sent)
}

/// The command's table: it must exist (a MergeTree table needs an engine and a sorting key,
/// which an Arrow schema does not give), and appending must be what the client asks for.
fn target_table(catalog: &Catalog, command: &CommandStatementIngest) -> Result<Arc<Table>, Status> {
    if command.catalog.as_deref().is_some_and(|c| c != CATALOG_NAME) {
        return Err(Status::not_found(format!("no catalog {:?}: the one catalog is {CATALOG_NAME}", command.catalog)));
    }
    if command.schema.as_deref().is_some_and(|s| s != DATABASE) {
        return Err(Status::not_found(format!("no database {:?}: tables are in {DATABASE}", command.schema)));
    }
    if command.temporary {
        return Err(Status::unimplemented("temporary tables are not supported"));
    }
    let options = command.table_definition_options.unwrap_or_default();
    let if_exists = TableExistsOption::try_from(options.if_exists).unwrap_or(TableExistsOption::Unspecified);
    let if_not_exist = TableNotExistOption::try_from(options.if_not_exist).unwrap_or(TableNotExistOption::Unspecified);
    match catalog.table(&command.table) {
        Ok(table) => match if_exists {
            TableExistsOption::Append => Ok(table),
            TableExistsOption::Fail => {
                Err(Status::already_exists(format!("table {DATABASE}.{} already exists", command.table)))
            }
            TableExistsOption::Replace => Err(Status::unimplemented(format!(
                "replacing table {DATABASE}.{} is not supported: append to it, or DROP and CREATE it first",
                command.table
            ))),
            TableExistsOption::Unspecified => Err(Status::invalid_argument(
                "the ingest command says nothing of an existing table: give if_exists (append, fail or replace)",
            )),
        },
        Err(e) => match if_not_exist {
            TableNotExistOption::Create => Err(Status::unimplemented(format!(
                "table {DATABASE}.{} does not exist, and cannot be made from an Arrow schema: a MergeTree table \
                 needs an ENGINE and ORDER BY; create it with CREATE TABLE, then ingest in append mode",
                command.table
            ))),
            _ => Err(status_of(e.into())),
        },
    }
}

fn token_of(command: &CommandStatementIngest) -> Result<Option<String>, Status> {
    let from_option = command.options.get(TOKEN_OPTION).filter(|t| !t.is_empty()).cloned();
    let from_transaction =
        command.transaction_id.as_ref().map(|id| id.iter().map(|b| format!("{b:02x}")).collect::<String>());
    match (from_option, from_transaction) {
        (Some(a), Some(b)) if a != b => Err(Status::invalid_argument(format!(
            "two deduplication tokens: the {TOKEN_OPTION} option and the transaction id; give one"
        ))),
        (a, b) => Ok(a.or(b)),
    }
}

fn concat(table: &Table, batches: Vec<RecordBatch>) -> Result<RecordBatch, Status> {
    concat_batches(&table.user_schema(), &batches).map_err(|e| Status::internal(format!("the ingested rows: {e}")))
}

async fn insert(
    catalog: &Catalog,
    table: &Arc<Table>,
    block: RecordBatch,
    token: &Option<String>,
    index: usize,
) -> Result<(), Status> {
    let options =
        InsertOptions { deduplication_token: token.as_ref().map(|t| format!("{t}_{index}")), ..Default::default() };
    table.insert_async(block, options).await.map_err(|e| status_of(e.into()))?;
    catalog.schedule_merges(table);
    Ok(())
}
