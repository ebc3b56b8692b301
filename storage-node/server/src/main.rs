//! `storage-node`: the storage node's binary. `storage-node local` is the clickhouse-local of
//! mergestream: it runs SQL statements against a data directory and prints the results.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use mergestream_engine::Catalog;
use mergestream_query::{OutputFormat, Session};

#[derive(Parser)]
#[command(name = "storage-node", version, about = "The mergestream storage node")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run SQL statements against a local data directory, like clickhouse-local.
    Local(LocalArgs),
}

#[derive(clap::Args)]
struct LocalArgs {
    /// The data directory (created if missing).
    #[arg(long)]
    path: PathBuf,
    /// Statements separated by ';'; read from standard input when absent.
    #[arg(long)]
    query: Option<String>,
    /// Output format: TSV, TSVWithNames, CSV, JSONEachRow, PrettyCompact.
    #[arg(long, default_value = "TSV")]
    format: String,
    /// Print each statement's elapsed seconds on standard error.
    #[arg(long)]
    time: bool,
    /// Threads running background merges.
    #[arg(long, default_value_t = 2)]
    merge_threads: usize,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("MERGESTREAM_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Local(args) => run_local(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run_local(args: LocalArgs) -> anyhow::Result<()> {
    let format = OutputFormat::parse(&args.format)?;
    let script = match args.query {
        Some(q) => q,
        None => {
            let mut text = String::new();
            std::io::stdin().read_to_string(&mut text).context("cannot read statements from standard input")?;
            text
        }
    };
    let catalog = Arc::new(
        Catalog::open(&args.path, args.merge_threads)
            .with_context(|| format!("cannot open the data directory {}", args.path.display()))?,
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    let mut session = Session::new(catalog, format);
    let show_time = args.time;
    let mut stdout = std::io::stdout().lock();
    let mut write_error = None;
    let result = runtime.block_on(session.run_script(&script, |_, text, elapsed| {
        if write_error.is_none() {
            if let Err(e) = stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
                write_error = Some(e);
            }
        }
        if show_time {
            eprintln!("{:.3}", elapsed.as_secs_f64());
        }
    }));
    if let Some(e) = write_error {
        return Err(e).context("cannot write the result");
    }
    result.map_err(anyhow::Error::from)
}
