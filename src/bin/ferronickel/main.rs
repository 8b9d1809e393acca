//! `ferronickel`: what the library sees on this machine, from the code that decides.
//!
//! - `info`: versions, GPUs and their links, the P2P matrix, bootstrap interfaces, settings;
//! - `topo --measure`: P2P bandwidth and latency between the local GPUs;
//! - `plan --nranks N`: rings, channels and the tuner's choice per message size;
//! - `perf [collective…]`: a quick, result-checked sweep over the local GPUs.
//!
//! Every subcommand prints text for people, or JSON with `--json`; `--help` after any of them
//! says its options (`args`). The README has a section per subcommand with real output.

mod args;
mod gpu;
mod info;
mod nvml;
mod perf;
mod plan;
mod topo;

use args::{Cli, Command};
use clap::{CommandFactory, Parser};
use serde_json::Value;

/// What a subcommand produced: text for people and the same facts as JSON for tools, and, when
/// the facts themselves are a failure (perf's wrong elements), why the exit status is 1.
pub struct Report {
    pub text: String,
    pub json: Value,
    pub failed: Option<String>,
}

/// A subcommand's failure: the message, printed to stderr (and as `{"error": …}` with `--json`).
pub type CmdResult = Result<Report, String>;

fn main() {
    std::process::exit(run(std::env::args_os()));
}

fn run(argv: impl IntoIterator<Item = std::ffi::OsString>) -> i32 {
    let argv: Vec<_> = argv.into_iter().collect();
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout with status 0; a usage error to stderr with status 2,
            // and under --json also as `{"error": …}` on stdout, so tools always get a document.
            if e.use_stderr() && argv.iter().any(|a| a == "--json") {
                println!("{}", serde_json::json!({ "error": e.render().to_string() }));
            }
            e.exit()
        }
    };
    let result = match cli.command {
        None => {
            Cli::command().print_help().expect("stdout is writable");
            return 0;
        }
        Some(Command::Info) => info::run(),
        Some(Command::Topo(a)) => topo::run(a),
        Some(Command::Plan(a)) => plan::run(a),
        Some(Command::Perf(a)) => perf::run(a),
    };
    match result {
        Ok(report) => {
            if cli.json {
                println!("{}", serde_json::to_string_pretty(&report.json).expect("a Value always serialises"));
            } else {
                print!("{}", report.text);
            }
            match report.failed {
                Some(why) => {
                    eprintln!("ferronickel: {why}");
                    1
                }
                None => 0,
            }
        }
        Err(e) => {
            if cli.json {
                println!("{}", serde_json::json!({ "error": e }));
            }
            eprintln!("ferronickel: {e}");
            1
        }
    }
}
