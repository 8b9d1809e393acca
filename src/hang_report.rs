//! The hang report: where each rank of a communicator stands, pooled round the ring by the
//! liveness watchers (bootstrap::liveness) and summed up in one line that names the culprit:
//! "op #1234 (AllReduce 4 MiB): ranks 0,1,3 wait in it; rank 2 (host h, pid 7) never entered it
//! (its last is #1233, finished); rank 1 waits for rank 2 (send) on channels 0-63 (steps taken 9,
//! given 1)".
//!
//! Pure code: a rank's state travels as one text line ([`RankState::encode`]), and
//! [`summarize`] reads the lines of every rank that answered. Lines come over the network, so
//! [`RankState::decode`] bounds every length and count.

use crate::abi::FN_MAX_CHANNELS;

/// Longest `what` and `who` a line carries (bytes).
const MAX_TEXT: usize = 96;
/// Longest channel field an encoder writes: with the texts above, a line stays well under the
/// 512 bytes the liveness watcher keeps of it.
const MAX_CHANNELS_TEXT: usize = 240;

/// One rank's operations on a communicator, as counted by the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankState {
    pub rank: usize,
    /// "rank 3 (host h, pid 7)".
    pub who: String,
    /// Operations (kernel launches or copy groups) issued so far; #issued is the newest.
    pub issued: u64,
    /// Whether the newest has finished on the GPU (as last seen by the host).
    pub finished: bool,
    /// What the newest is: "AllReduce 4194304 B" (no '|' or newline).
    pub what: String,
    /// The device watchdog stopped the newest while it waited on a peer.
    pub timed_out: bool,
    /// Where the newest's ring channels stand.
    pub channels: Channels,
}

/// Where the ring channels of a rank's newest operation stand, read from its FIFO counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Channels {
    /// Nothing to say: no ring operation in flight.
    None,
    /// The counters could not be read in time (the copy waited behind the GPU).
    Unknown,
    /// Per run of channels, steps of this operation taken from `prev` and given to `next`.
    /// `more`: runs past these were left out to keep the line short.
    Read { prev: usize, next: usize, runs: Vec<Run>, more: bool },
}

/// Consecutive channels whose counters agree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub first: usize,
    pub last: usize,
    /// Steps of this operation taken from the ring's previous rank (our receive head).
    pub took: u64,
    /// Steps of this operation the ring's next rank took of ours (our send head).
    pub gave: u64,
}

impl Run {
    /// A ring step receives, then sends what it made of it: a channel that has taken no more
    /// than the next rank took of it lacks data from the previous rank (recv); one that has
    /// taken more waits for the next rank to free a FIFO slot (send).
    pub fn waits_for_prev(&self) -> bool {
        self.took <= self.gave
    }
}

/// Groups per-channel (took, gave) counts, channel 0 first, into runs of equal neighbours.
pub fn runs(per_channel: &[(u64, u64)]) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::new();
    for (c, &(took, gave)) in per_channel.iter().enumerate() {
        match out.last_mut() {
            Some(r) if r.took == took && r.gave == gave => r.last = c,
            _ => out.push(Run { first: c, last: c, took, gave }),
        }
    }
    out
}

impl Channels {
    /// `-`, `?`, or `prev,next;first-last:took:gave;...` with `;+` when runs were left out;
    /// at most [`MAX_CHANNELS_TEXT`] bytes.
    fn encode(&self) -> String {
        let Channels::Read { prev, next, runs, more } = self else {
            return if *self == Channels::Unknown { "?" } else { "-" }.into();
        };
        let mut out = format!("{prev},{next}");
        let mut cut = *more;
        for r in runs {
            let run = format!(";{}-{}:{}:{}", r.first, r.last, r.took, r.gave);
            if out.len() + run.len() + 2 > MAX_CHANNELS_TEXT {
                cut = true;
                break;
            }
            out += &run;
        }
        if cut {
            out += ";+";
        }
        out
    }

    /// None for a field that is not one: runs must be in order, within the channel limit.
    fn decode(field: &str) -> Option<Channels> {
        match field {
            "-" => return Some(Channels::None),
            "?" => return Some(Channels::Unknown),
            _ => {}
        }
        let max = FN_MAX_CHANNELS as usize;
        let mut parts = field.split(';');
        let (prev, next) = parts.next()?.split_once(',')?;
        let (prev, next) = (prev.parse().ok()?, next.parse().ok()?);
        let (mut runs, mut more) = (Vec::new(), false);
        for part in parts {
            if more || runs.len() == max {
                return None;
            }
            if part == "+" {
                more = true;
                continue;
            }
            let (span, counts) = part.split_once(':')?;
            let (first, last) = span.split_once('-')?;
            let (took, gave) = counts.split_once(':')?;
            let r = Run {
                first: first.parse().ok()?,
                last: last.parse().ok()?,
                took: took.parse().ok()?,
                gave: gave.parse().ok()?,
            };
            let after = runs.last().map_or(0, |p: &Run| p.last + 1);
            if r.first < after || r.last < r.first || r.last >= max {
                return None;
            }
            runs.push(r);
        }
        Some(Channels::Read { prev, next, runs, more })
    }
}

/// At most `n` bytes of `s` (whole characters), without '|' or newlines.
fn clean(s: &str, n: usize) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if out.len() + c.len_utf8() > n {
            break;
        }
        out.push(if matches!(c, '|' | '\n' | '\r') { ' ' } else { c });
    }
    out
}

impl RankState {
    /// `rank|issued|finished|timed_out|what|channels|who`: one line, fields without '|'.
    pub fn encode(&self) -> String {
        format!(
            "{}|{}|{}|{}|{}|{}|{}",
            self.rank,
            self.issued,
            self.finished as u8,
            self.timed_out as u8,
            clean(&self.what, MAX_TEXT),
            self.channels.encode(),
            clean(&self.who, MAX_TEXT)
        )
    }

    /// None for a line that is not a state (it came over the network: never trusted).
    pub fn decode(line: &str) -> Option<RankState> {
        let mut f = line.splitn(7, '|');
        Some(RankState {
            rank: f.next()?.parse().ok()?,
            issued: f.next()?.parse().ok()?,
            finished: f.next()? == "1",
            timed_out: f.next()? == "1",
            what: clean(f.next()?, MAX_TEXT),
            channels: Channels::decode(f.next()?)?,
            who: clean(f.next()?, MAX_TEXT),
        })
    }
}

/// The summary of the states of `nranks` ranks (some may be missing: their watcher did not
/// answer). Names the newest operation, who waits in it, who never entered it, and for each rank
/// still in it which neighbour its ring channels wait for.
pub fn summarize(nranks: usize, states: &[RankState]) -> String {
    let Some(newest) = states.iter().map(|s| s.issued).max() else {
        return "hang report: no rank answered".into();
    };
    let what = states.iter().find(|s| s.issued == newest).map_or("", |s| s.what.as_str());
    let list = |v: &[&RankState]| v.iter().map(|s| s.rank.to_string()).collect::<Vec<_>>().join(",");
    let inside: Vec<&RankState> = states.iter().filter(|s| s.issued == newest && !s.finished).collect();
    let done: Vec<&RankState> = states.iter().filter(|s| s.issued == newest && s.finished).collect();
    let behind: Vec<&RankState> = states.iter().filter(|s| s.issued < newest).collect();
    let timed_out: Vec<&RankState> = states.iter().filter(|s| s.issued == newest && s.timed_out).collect();
    let mut out = format!("hang report: op #{newest} ({what})");
    if !inside.is_empty() {
        out += &format!(": rank(s) {} wait in it", list(&inside));
    }
    if !timed_out.is_empty() {
        out += &format!("; rank(s) {} gave up waiting in it (device watchdog)", list(&timed_out));
    }
    if !done.is_empty() && done.len() != timed_out.len() {
        let finished: Vec<&RankState> = done.iter().copied().filter(|s| !s.timed_out).collect();
        if !finished.is_empty() {
            out += &format!("; rank(s) {} finished it", list(&finished));
        }
    }
    for s in &behind {
        out += &format!(
            "; {} never entered it (its last is #{}, {})",
            s.who,
            s.issued,
            if s.finished { "finished" } else { "still running" }
        );
    }
    for s in states.iter().filter(|s| s.issued == newest && (!s.finished || s.timed_out)) {
        out += &waits(s.rank, &s.channels);
    }
    let missing: Vec<String> =
        (0..nranks).filter(|r| !states.iter().any(|s| s.rank == *r)).map(|r| r.to_string()).collect();
    if !missing.is_empty() {
        out += &format!("; rank(s) {} did not answer", missing.join(","));
    }
    out
}

/// "; rank 1 waits for rank 2 (send) on channels 0-63 (steps taken 9, given 1)", one clause per
/// neighbour waited for.
fn waits(rank: usize, channels: &Channels) -> String {
    let (prev, next, runs, more) = match channels {
        Channels::None => return String::new(),
        Channels::Unknown => return format!("; rank {rank}'s FIFO counters could not be read in time"),
        Channels::Read { prev, next, runs, more } => (*prev, *next, runs, *more),
    };
    let span = |lo: u64, hi: u64| if lo == hi { lo.to_string() } else { format!("{lo}-{hi}") };
    let mut out = String::new();
    for (to_prev, peer, side) in [(true, prev, "recv"), (false, next, "send")] {
        let mine: Vec<&Run> = runs.iter().filter(|r| r.waits_for_prev() == to_prev).collect();
        if mine.is_empty() {
            continue;
        }
        // Adjacent runs merge into one range of channels.
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for r in &mine {
            match ranges.last_mut() {
                Some(last) if last.1 + 1 == r.first => last.1 = r.last,
                _ => ranges.push((r.first, r.last)),
            }
        }
        let chans: Vec<String> =
            ranges.iter().map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") }).collect();
        let took = span(mine.iter().map(|r| r.took).min().unwrap_or(0), mine.iter().map(|r| r.took).max().unwrap_or(0));
        let gave = span(mine.iter().map(|r| r.gave).min().unwrap_or(0), mine.iter().map(|r| r.gave).max().unwrap_or(0));
        out += &format!(
            "; rank {rank} waits for rank {peer} ({side}) on channels {}{} (steps taken {took}, given {gave})",
            chans.join(","),
            if more { " and others not listed" } else { "" }
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(rank: usize, issued: u64, finished: bool) -> RankState {
        RankState {
            rank,
            who: format!("rank {rank} (host h{rank}, pid {})", 100 + rank),
            issued,
            finished,
            what: "AllReduce 4194304 B".into(),
            timed_out: false,
            channels: Channels::None,
        }
    }

    #[test]
    fn states_round_trip_and_junk_is_refused() {
        let mut s = st(3, 1234, false);
        s.what = "a|b\nc".into();
        let back = RankState::decode(&s.encode()).unwrap();
        assert_eq!(back.what, "a b c");
        assert_eq!((back.rank, back.issued, back.finished), (3, 1234, false));
        for junk in ["", "x|1|0|0|w|who", "1|2|0", "1|-2|0|0|w|who"] {
            assert_eq!(RankState::decode(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn names_the_rank_that_never_entered() {
        let states = [st(0, 1234, false), st(1, 1234, false), st(2, 1233, true), st(3, 1234, false)];
        assert_eq!(
            summarize(4, &states),
            "hang report: op #1234 (AllReduce 4194304 B): rank(s) 0,1,3 wait in it; rank 2 (host h2, pid 102) \
             never entered it (its last is #1233, finished)"
        );
    }

    #[test]
    fn watchdog_and_missing_ranks() {
        let mut a = st(0, 7, true);
        a.timed_out = true;
        let states = [a, st(2, 6, true)];
        assert_eq!(
            summarize(3, &states),
            "hang report: op #7 (AllReduce 4194304 B); rank(s) 0 gave up waiting in it (device watchdog); \
             rank 2 (host h2, pid 102) never entered it (its last is #6, finished); rank(s) 1 did not answer"
        );
        assert_eq!(summarize(2, &[]), "hang report: no rank answered");
    }

    fn read(prev: usize, next: usize, per_channel: &[(u64, u64)]) -> Channels {
        Channels::Read { prev, next, runs: runs(per_channel), more: false }
    }

    #[test]
    fn equal_channels_are_grouped_into_runs() {
        let mut c = vec![(40, 41); 32];
        c.extend(vec![(39, 41); 31]);
        c.push((40, 41));
        assert_eq!(
            runs(&c),
            [
                Run { first: 0, last: 31, took: 40, gave: 41 },
                Run { first: 32, last: 62, took: 39, gave: 41 },
                Run { first: 63, last: 63, took: 40, gave: 41 }
            ]
        );
        assert!(runs(&[]).is_empty());
    }

    #[test]
    fn channel_states_round_trip() {
        for channels in [Channels::None, Channels::Unknown, read(3, 1, &[(40, 41), (40, 41), (9, 1)])] {
            let mut s = st(0, 12, false);
            s.channels = channels;
            assert_eq!(RankState::decode(&s.encode()), Some(s));
        }
    }

    #[test]
    fn long_states_stay_bounded_and_say_what_was_cut() {
        // 64 channels that all differ, with the largest counts: more than the field may hold.
        let per: Vec<(u64, u64)> = (0..64).map(|c| (u64::MAX - c, c)).collect();
        let mut s = st(1, 5, false);
        s.channels = read(0, 2, &per);
        s.what = "x".repeat(10_000);
        s.who = "é".repeat(10_000);
        let line = s.encode();
        assert!(line.len() < 512, "{} bytes", line.len());
        let back = RankState::decode(&line).unwrap();
        let Channels::Read { runs, more, .. } = back.channels else { panic!("{line}") };
        assert!(more && !runs.is_empty() && runs.len() < 64, "{} runs", runs.len());
        assert_eq!(runs[0], Run { first: 0, last: 0, took: u64::MAX, gave: 0 });
        assert_eq!((back.what.len(), back.who.len()), (MAX_TEXT, MAX_TEXT));
    }

    #[test]
    fn hostile_channel_fields_are_refused() {
        let line = |ch: &str| format!("1|5|0|0|AllReduce|{ch}|rank 1");
        assert!(RankState::decode(&line("0,2;0-63:4:5")).is_some());
        let many_runs: String = (0..65).map(|c| format!(";{c}-{c}:1:1")).collect();
        let junk = [
            "",
            "0,2;",
            "0,2;0-64:1:1",                      // past the last channel
            "0,2;5-3:1:1",                       // backwards
            "0,2;0-9:1:1;5-12:1:1",              // overlapping
            "0,2;0-9:1:1;+;10-12:1:1",           // a run after the end mark
            "0,2;0-9:1",                         // a count missing
            "0,2;0-9:-1:1",                      // negative
            "0,2;0-9:1:99999999999999999999999", // overflows u64
            "x,2;0-9:1:1",
            "0;0-9:1:1",
            "?x",
        ];
        for ch in junk {
            assert_eq!(RankState::decode(&line(ch)), None, "{ch:?}");
        }
        assert_eq!(RankState::decode(&line(&format!("0,2{many_runs}"))), None);
        // The channel field may not swallow the name: a line needs all seven fields.
        assert_eq!(RankState::decode("1|5|0|0|AllReduce|-"), None);
    }

    #[test]
    fn names_the_neighbour_each_rank_waits_for() {
        // Rank 2 of 4 never entered op #12: rank 1 cannot give it anything (send), rank 3 gets
        // nothing from it (recv), rank 0 waits on rank 3 (recv) on half its channels.
        let mut s0 = st(0, 12, false);
        let mut half = vec![(1, 2); 32];
        half.extend(vec![(9, 2); 32]);
        s0.channels = read(3, 1, &half);
        let mut s1 = st(1, 12, false);
        s1.channels = read(0, 2, &[(9, 1); 64]);
        let s2 = st(2, 11, true);
        let mut s3 = st(3, 12, false);
        s3.channels = Channels::Unknown;
        let got = summarize(4, &[s0, s1, s2, s3]);
        assert_eq!(
            got,
            "hang report: op #12 (AllReduce 4194304 B): rank(s) 0,1,3 wait in it; rank 2 (host h2, pid 102) never \
             entered it (its last is #11, finished); rank 0 waits for rank 3 (recv) on channels 0-31 (steps taken 1, \
             given 2); rank 0 waits for rank 1 (send) on channels 32-63 (steps taken 9, given 2); rank 1 waits for \
             rank 2 (send) on channels 0-63 (steps taken 9, given 1); rank 3's FIFO counters could not be read in time"
        );
    }
}
