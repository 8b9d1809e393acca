//! The profiler plugin's view of a connection's proxy work (docs/PLUGINS.md, "Profiler"): each
//! direction's steps as `ncclProfileProxyStep` events under an `ncclProfileProxyOp` that spans a
//! run of steps, from the first step after an idle spell to the next idle spell.

use std::collections::VecDeque;
use std::sync::Arc;

use super::block::Layout;
use crate::plugin::abi::{
    ncclProfileNetPlugin, ncclProfileProxyOp, ncclProfileProxyStep, ncclProfilerEventState_t,
    ncclProfilerProxyStepRecvWait, ncclProfilerProxyStepSendWait,
};
use crate::plugin::profiler::{Descr, Event, Parent, Profiler};

/// Who a connection is, for a profiler plugin's events.
#[derive(Clone)]
pub struct TraceInfo {
    pub profiler: Arc<Profiler>,
    pub peer: usize,
    pub channel: usize,
}

/// One direction's open profiler events: its proxy op and the steps in flight under it (the
/// steps first, so that they stop before their op when dropped).
pub(super) struct Trace {
    steps: VecDeque<(u64, Event)>,
    op: Option<Event>,
    info: TraceInfo,
    is_send: bool,
    /// Bytes of the Simple slot, the proxy op's chunk size.
    chunk: usize,
}

impl Trace {
    pub(super) fn new(info: Option<&TraceInfo>, is_send: bool, layout: &Layout) -> Option<Trace> {
        let info = info?.clone();
        let bits = (ncclProfileProxyOp | ncclProfileProxyStep) as i32;
        info.profiler.wants(bits).then(|| Trace {
            steps: VecDeque::new(),
            op: None,
            info,
            is_send,
            chunk: layout.slot_bytes,
        })
    }

    /// Step `step` of `bytes` started: under the open proxy op, or a new one with the steps
    /// queued now (`queued`). A step already started (a send retried for want of a request
    /// slot) keeps its event.
    pub(super) fn step(&mut self, step: u64, bytes: usize, queued: u64) {
        if self.steps.iter().any(|(s, _)| *s == step) {
            return;
        }
        if self.op.is_none() {
            let d = Descr::ProxyOp {
                channel: self.info.channel as u8,
                peer: self.info.peer as i32,
                nsteps: queued.min(i32::MAX as u64) as i32,
                chunk: self.chunk.min(i32::MAX as usize) as i32,
                is_send: self.is_send,
            };
            self.op = self.info.profiler.start_event(&d, None);
        }
        let d = Descr::ProxyStep { step: step.min(i32::MAX as u64) as i32 };
        if let Some(e) = self.info.profiler.start_event(&d, self.op.as_ref()) {
            let state: ncclProfilerEventState_t =
                if self.is_send { ncclProfilerProxyStepSendWait } else { ncclProfilerProxyStepRecvWait };
            e.record_step(state, bytes);
            self.steps.push_back((step, e));
        }
    }

    /// The event of step `step`, if started, as the parent a net plugin starts its events under
    /// (`None` where the profiler wants no net-plugin events).
    pub(super) fn parent(&self, step: u64) -> Option<Parent> {
        if !self.info.profiler.wants(ncclProfileNetPlugin as i32) {
            return None;
        }
        self.steps.iter().find(|(s, _)| *s == step).map(|(_, e)| e.as_parent())
    }

    /// Steps before `end` are done.
    pub(super) fn done(&mut self, end: u64) {
        while self.steps.front().is_some_and(|(s, _)| *s < end) {
            self.steps.pop_front();
        }
    }

    /// Nothing in flight: the proxy op ends.
    pub(super) fn idle(&mut self) {
        self.steps.clear();
        self.op = None;
    }
}
