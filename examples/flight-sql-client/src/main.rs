//! A Flight SQL client of a storage node, written against nothing but `arrow-flight`'s
//! `FlightSqlServiceClient`: what any Rust program needs to query mergestream.
//!
//! ```text
//! storage-node serve --path data --flight-addr 127.0.0.1:9200 &
//! flight-sql-client --addr http://127.0.0.1:9200 "SELECT number FROM numbers(3)"
//! flight-sql-client --addr http://127.0.0.1:9200 --user alice --password secret \
//!     "SELECT * FROM orders FINAL WHERE customer = ?" --param 42
//! ```
//!
//! A statement with `?` placeholders is prepared, its parameters bound from `--param` (as
//! strings: the server casts them to the placeholders' types) and executed; one without runs
//! directly. Rows print as tab-separated values with a header, as `FORMAT TSVWithNames`.

use std::sync::Arc;

use anyhow::Context;
use arrow::array::{ArrayRef, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::FlightInfo;
use clap::Parser;
use futures::TryStreamExt;
use tonic::transport::{Channel, Endpoint};

#[derive(Parser)]
#[command(about = "Runs one SQL statement on a storage node over Arrow Flight SQL")]
struct Args {
    /// The storage node's Flight SQL address (`serve --flight-addr`).
    #[arg(long, default_value = "http://127.0.0.1:9200")]
    addr: String,
    /// A user of the node's `[[users]]`; the handshake trades the password for a bearer token.
    #[arg(long, requires = "password")]
    user: Option<String>,
    #[arg(long, env = "MERGESTREAM_PASSWORD", hide_env_values = true)]
    password: Option<String>,
    /// The value of the next `?` placeholder, in order.
    #[arg(long = "param")]
    params: Vec<String>,
    /// The statement: a query prints its rows; any other runs and prints nothing.
    sql: String,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let channel = Endpoint::from_shared(args.addr.clone())?
        .connect()
        .await
        .with_context(|| format!("cannot reach {}", args.addr))?;
    let mut client = FlightSqlServiceClient::new(channel);
    if let (Some(user), Some(password)) = (&args.user, &args.password) {
        client.handshake(user, password).await.context("the handshake")?;
    }

    let info = if args.params.is_empty() {
        client.execute(args.sql.clone(), None).await?
    } else {
        let mut statement = client.prepare(args.sql.clone(), None).await?;
        statement.set_parameters(parameters(&args.params)?)?;
        let info = statement.execute().await?;
        statement.close().await?;
        info
    };
    print_rows(&mut client, info).await
}

/// One row of string parameters named as the placeholders are by position.
fn parameters(values: &[String]) -> anyhow::Result<RecordBatch> {
    let fields: Vec<Field> = (0..values.len()).map(|i| Field::new(i.to_string(), DataType::Utf8, false)).collect();
    let columns: Vec<ArrayRef> =
        values.iter().map(|v| Arc::new(StringArray::from(vec![v.as_str()])) as ArrayRef).collect();
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?)
}

/// Reads every endpoint's stream batch by batch (never the whole result at once).
async fn print_rows(client: &mut FlightSqlServiceClient<Channel>, info: FlightInfo) -> anyhow::Result<()> {
    let schema = info.clone().try_decode_schema()?;
    if !schema.fields().is_empty() {
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        println!("{}", names.join("\t"));
    }
    let options = FormatOptions::default().with_null("\\N");
    for endpoint in info.endpoint {
        let ticket = endpoint.ticket.context("an endpoint without a ticket")?;
        let mut batches = client.do_get(ticket).await?;
        while let Some(batch) = batches.try_next().await? {
            let formatters = batch
                .columns()
                .iter()
                .map(|column| ArrayFormatter::try_new(column.as_ref(), &options))
                .collect::<Result<Vec<_>, _>>()?;
            for row in 0..batch.num_rows() {
                let cells: Vec<String> = formatters.iter().map(|f| f.value(row).to_string()).collect();
                println!("{}", cells.join("\t"));
            }
        }
    }
    Ok(())
}
