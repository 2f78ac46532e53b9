use std::process::ExitCode;

use clap::Parser;
use tracekit::{
    error::{one_line, Exit, EXIT_CODES_HELP},
    tools::Tool,
};

/// eBPF tracing for the slow node whose dashboards look normal: finds the process stalled in
/// fsync, compaction or the run queue that `top` hides.
#[derive(Parser, Debug)]
#[command(
    name = "tracekit",
    version,
    after_help = EXIT_CODES_HELP,
    arg_required_else_help = true
)]
struct Cli {
    #[command(subcommand)]
    tool: Tool,
}

/// One line on stderr; a closed stderr is not worth a panic.
fn say(msg: std::fmt::Arguments) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{msg}");
}

fn main() -> ExitCode {
    // Before anything else: a SIGINT in the first milliseconds (a script's background job gets
    // SIGINT ignored, and a user may press Ctrl-C at once) must end the run, not be lost.
    if let Err(e) = tracekit::engine::install_signal_handlers() {
        say(format_args!(
            "tracekit: error: installing signal handlers: {e}"
        ));
        return Exit::Failure.into();
    }
    // Debug logging of the engine (attach fallbacks, timings) with RUST_LOG=tracekit=debug.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("RUST_LOG"))
        .with_writer(std::io::stderr)
        .init();
    // A bug must not print a backtrace over the report: one line, and exit code 1. The kernel
    // still frees everything (nothing is pinned), and the unwinding drops the session.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        say(format_args!(
            "tracekit: internal error: {}{at} (a bug: please report it)",
            tracekit::report::sanitize::text(msg.as_bytes())
        ));
    }));
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            return match e.kind() {
                // Bare `tracekit` (or a tool group without a tool): the usage and tool list,
                // on stderr, as a usage error.
                ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    let _ = e.print();
                    Exit::Usage.into()
                }
                _ if e.use_stderr() => {
                    // clap's first line is the error itself; the rest (usage, tips) is noise in
                    // a one-line contract.
                    let msg = e.to_string();
                    let first = msg.lines().next().unwrap_or("invalid arguments");
                    say(format_args!(
                        "tracekit: {}",
                        first.trim_start_matches("error: ")
                    ));
                    Exit::Usage.into()
                }
                // --help, --version: a closed stdout (`| head`) is not an error.
                _ => {
                    let _ = e.print();
                    Exit::Ok.into()
                }
            };
        }
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cli.tool.run())) {
        Ok(Ok(())) => Exit::Ok.into(),
        // The reader of the report went away (`| head`): a quiet, successful end.
        Ok(Err(err)) if err.is_broken_pipe() => Exit::Ok.into(),
        Ok(Err(err)) => {
            say(format_args!("tracekit: error: {}", one_line(&err)));
            err.exit().into()
        }
        Err(_) => Exit::Failure.into(),
    }
}
