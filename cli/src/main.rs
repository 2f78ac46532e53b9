use std::process::ExitCode;

use clap::Parser;
use tracekit::{
    error::{exit_for, one_line, Exit, EXIT_CODES_HELP},
    tools::Tool,
};

/// eBPF tracing for the slow node whose dashboards look normal: finds the process stalled in
/// fsync, compaction or the run queue that `top` hides.
#[derive(Parser, Debug)]
#[command(name = "tracekit", version, after_help = EXIT_CODES_HELP)]
struct Cli {
    #[command(subcommand)]
    tool: Tool,
}

fn main() -> ExitCode {
    // Debug logging of the engine (attach fallbacks, timings) with RUST_LOG=tracekit=debug.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("RUST_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() {
                Exit::Usage
            } else {
                Exit::Ok
            };
            if code == Exit::Usage {
                // clap's first line is the error itself; the rest (usage, tips) is noise in a
                // one-line contract.
                let msg = e.to_string();
                let first = msg.lines().next().unwrap_or("invalid arguments");
                eprintln!("tracekit: {}", first.trim_start_matches("error: "));
            } else {
                let _ = e.print();
            }
            return code.into();
        }
    };
    match cli.tool.run() {
        Ok(()) => Exit::Ok.into(),
        Err(err) => {
            eprintln!("tracekit: error: {}", one_line(&err));
            exit_for(&err).into()
        }
    }
}
