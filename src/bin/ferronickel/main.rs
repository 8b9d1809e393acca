//! `ferronickel`: what the library sees on this machine, from the code that decides.
//!
//! - `info`: versions, GPUs and their links, the P2P matrix, bootstrap interfaces, settings;
//! - `topo --measure`: P2P bandwidth and latency between the local GPUs;
//! - `plan --nranks N`: rings, channels and the tuner's choice per message size;
//! - `perf [collective…]`: a quick, result-checked sweep over the local GPUs.
//!
//! Every subcommand prints text for people, or JSON with `--json`. The README has a section per
//! subcommand with real output.

mod args;
mod gpu;
mod info;
mod nvml;
mod perf;
mod plan;
mod topo;

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

const USAGE: &str = "\
usage: ferronickel <command> [options] [--json]

commands:
  info                                   versions, GPUs, links, P2P access, interfaces, settings
  topo --measure [--bytes B] [--iters N] P2P bandwidth (copy engines and SM copies, one and both
                                         directions) and latency between the local GPUs
  plan --nranks N [--hosts H] [--gpus-per-host G]
                                         rings, channels and the tuner's algorithm and protocol
                                         per message size, for this machine or a described one
  perf [collective...] [--ranks-per-gpu R] [--min-bytes B] [--max-bytes B] [--factor F]
       [--iters N] [--warmup N]          a checked sweep over the local GPUs, nccl-tests' columns
                                         (collectives: all_reduce all_gather reduce_scatter
                                         broadcast reduce alltoall; default: all of them)

--json prints the same facts as one JSON document on stdout.";

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(run(argv));
}

fn run(argv: Vec<String>) -> i32 {
    let json = argv.iter().any(|a| a == "--json");
    let mut rest = argv.into_iter().filter(|a| a != "--json");
    let cmd = rest.next();
    let args = args::Args::parse(rest.collect());
    let result = match (cmd.as_deref(), args) {
        (None | Some("help" | "-h" | "--help"), _) => {
            println!("{USAGE}");
            return 0;
        }
        (_, Err(e)) => Err(e),
        (Some("info"), Ok(a)) => info::run(a),
        (Some("topo"), Ok(a)) => topo::run(a),
        (Some("plan"), Ok(a)) => plan::run(a),
        (Some("perf"), Ok(a)) => perf::run(a),
        (Some(other), _) => Err(format!("unknown command {other:?}\n\n{USAGE}")),
    };
    match result {
        Ok(report) => {
            if json {
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
            if json {
                println!("{}", serde_json::json!({ "error": e }));
            }
            eprintln!("ferronickel: {e}");
            1
        }
    }
}
