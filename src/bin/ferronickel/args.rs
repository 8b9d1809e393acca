//! The command line, declared once with clap: each subcommand's `--help`, the usage errors (exit
//! status 2, naming the option) and the parsed values all come from these types.

use clap::{Args, Parser, Subcommand};

/// What the library sees on this machine, from the code that decides.
#[derive(Parser, Debug)]
#[command(name = "ferronickel", version, after_help = "Each command prints text for people, or JSON with --json.")]
pub struct Cli {
    /// Print the same facts as one JSON document on stdout.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Versions, GPUs, links, P2P access, interfaces, settings.
    Info,
    /// P2P bandwidth (copy engines and SM copies, one and both directions) and latency between
    /// the local GPUs.
    Topo(TopoArgs),
    /// Rings, channels and the tuner's algorithm and protocol per message size, for this machine
    /// or a described one.
    Plan(PlanArgs),
    /// A checked sweep over the local GPUs, with nccl-tests' columns.
    Perf(PerfArgs),
}

#[derive(Args, Debug)]
pub struct TopoArgs {
    /// Measure (the static topology, links and P2P access are in `ferronickel info`).
    #[arg(long)]
    pub measure: bool,
    /// Bytes per copy (K, M, G suffixes), 16 to 4G.
    #[arg(long, value_name = "B", default_value = "64M", value_parser = size)]
    pub bytes: usize,
    /// Timed copies per measurement, at most 10000.
    #[arg(long, value_name = "N", default_value = "10", value_parser = size)]
    pub iters: usize,
}

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Ranks in the communicator, at most 65536.
    #[arg(long, value_name = "N", value_parser = size)]
    pub nranks: usize,
    /// Hosts the ranks are spread over, evenly [default: 1].
    #[arg(long, value_name = "H", value_parser = size)]
    pub hosts: Option<usize>,
    /// GPUs per host [default: this machine's; without a GPU, N / H when --hosts is given].
    #[arg(long, value_name = "G", value_parser = size)]
    pub gpus_per_host: Option<usize>,
}

#[derive(Args, Debug)]
pub struct PerfArgs {
    /// Collectives to run: all_reduce all_gather reduce_scatter broadcast reduce alltoall
    /// [default: all of them].
    #[arg(value_name = "COLLECTIVE")]
    pub collectives: Vec<String>,
    /// Ranks per GPU, at most 64.
    #[arg(long, value_name = "R", default_value = "1", value_parser = size)]
    pub ranks_per_gpu: usize,
    /// Smallest message (K, M, G suffixes).
    #[arg(long, value_name = "B", default_value = "8", value_parser = size)]
    pub min_bytes: usize,
    /// Largest message, at most 16G.
    #[arg(long, value_name = "B", default_value = "64M", value_parser = size)]
    pub max_bytes: usize,
    /// Growth between sizes, at least 2.
    #[arg(long, value_name = "F", default_value = "2", value_parser = size)]
    pub factor: usize,
    /// Timed iterations per size.
    #[arg(long, value_name = "N", default_value = "20", value_parser = size)]
    pub iters: usize,
    /// Untimed iterations before them.
    #[arg(long, value_name = "N", default_value = "5", value_parser = size)]
    pub warmup: usize,
}

/// A positive integer, with K, M or G (binary multiples): `4096`, `64K`, `16M`, `1G`.
fn size(v: &str) -> Result<usize, String> {
    parse_size(v).ok_or_else(|| "not a positive integer (K, M and G suffixes allowed)".to_string())
}

fn parse_size(v: &str) -> Option<usize> {
    let v = v.trim();
    let (digits, mult) = match v.char_indices().last()? {
        (i, 'K' | 'k') => (&v[..i], 1usize << 10),
        (i, 'M' | 'm') => (&v[..i], 1 << 20),
        (i, 'G' | 'g') => (&v[..i], 1 << 30),
        _ => (v, 1),
    };
    digits.parse::<usize>().ok().and_then(|n| n.checked_mul(mult)).filter(|&n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(s: &str) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("ferronickel").chain(s.split_whitespace()))
    }

    #[test]
    fn the_declaration_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn options_flags_and_words() {
        let cli = parse("perf all_reduce --ranks-per-gpu 2 --max-bytes=1M broadcast --json").unwrap();
        assert!(cli.json);
        let Some(Command::Perf(p)) = cli.command else { panic!("not perf") };
        assert_eq!(p.collectives, ["all_reduce", "broadcast"]);
        assert_eq!((p.ranks_per_gpu, p.min_bytes, p.max_bytes, p.factor), (2, 8, 1 << 20, 2));
        let Some(Command::Topo(t)) = parse("--json topo --measure").unwrap().command else { panic!("not topo") };
        assert!(t.measure);
        assert_eq!((t.bytes, t.iters), (64 << 20, 10));
    }

    #[test]
    fn mistakes_are_errors() {
        use clap::error::ErrorKind;
        assert_eq!(parse("plan --nranks 2 --nranks 3").unwrap_err().kind(), ErrorKind::ArgumentConflict);
        assert_eq!(parse("plan --nranks zero").unwrap_err().kind(), ErrorKind::ValueValidation);
        assert_eq!(parse("plan --hosts 2").unwrap_err().kind(), ErrorKind::MissingRequiredArgument);
        assert_eq!(parse("topo --measure --typo").unwrap_err().kind(), ErrorKind::UnknownArgument);
        assert_eq!(parse("topo --measure=1").unwrap_err().kind(), ErrorKind::TooManyValues);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64K"), Some(65536));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("8"), Some(8));
        assert_eq!(parse_size("0"), None);
        assert_eq!(parse_size("K"), None);
        assert_eq!(parse_size("-1"), None);
    }
}
