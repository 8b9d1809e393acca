//! The hang report: where each rank of a communicator stands, pooled round the ring by the
//! liveness watchers (bootstrap::liveness) and summed up in one line that names the culprit:
//! "op #1234 (AllReduce 4 MiB): ranks 0,1,3 wait in it; rank 2 (host h, pid 7) never entered it
//! (its last is #1233, finished)".
//!
//! Pure code: a rank's state travels as one text line ([`RankState::encode`]), and
//! [`summarize`] reads the lines of every rank that answered.

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
}

impl RankState {
    /// `rank|issued|finished|timed_out|what|who`: one line, fields without '|'.
    pub fn encode(&self) -> String {
        let clean = |s: &str| s.replace(['|', '\n'], " ");
        format!(
            "{}|{}|{}|{}|{}|{}",
            self.rank,
            self.issued,
            self.finished as u8,
            self.timed_out as u8,
            clean(&self.what),
            clean(&self.who)
        )
    }

    /// None for a line that is not a state (it came over the network: never trusted).
    pub fn decode(line: &str) -> Option<RankState> {
        let mut f = line.splitn(6, '|');
        Some(RankState {
            rank: f.next()?.parse().ok()?,
            issued: f.next()?.parse().ok()?,
            finished: f.next()? == "1",
            timed_out: f.next()? == "1",
            what: f.next()?.to_string(),
            who: f.next()?.to_string(),
        })
    }
}

/// The summary of the states of `nranks` ranks (some may be missing: their watcher did not
/// answer). Names the newest operation, who waits in it, and who never entered it.
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
    let missing: Vec<String> =
        (0..nranks).filter(|r| !states.iter().any(|s| s.rank == *r)).map(|r| r.to_string()).collect();
    if !missing.is_empty() {
        out += &format!("; rank(s) {} did not answer", missing.join(","));
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
}
