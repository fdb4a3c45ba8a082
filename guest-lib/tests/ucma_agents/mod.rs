//! An agent serving an in-process device in a thread of the test, for the
//! rdma_ucm tests (`ucma_agent.rs`, `ucma_hostile.rs`).
// Each test binary uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use vrnic::link::mem::MemLink;
use vrnic_guest::agent::client::AgentTransport;
use vrnic_guest::agent::ucma::proto::UcmaConn;
use vrnic_guest::agent::ucma::service::SharedStats;
use vrnic_guest::agent::{procmem::ProcessMemory, server::Agent};
use vrnic_guest::loopback::LoopbackTransport;
use vrnic_guest::verbs::{Context, Cq, Mr, Pd, ACCESS_LOCAL_WRITE};

use super::ucma_common::DEADLINE;
use super::verbs_common::config;

/// An agent serving one in-process device, in a thread of its own.
pub struct AgentThread {
    /// The agent's socket.
    pub path: PathBuf,
    /// What its rdma_cm service holds.
    pub ucma: SharedStats,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for AgentThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An agent at `DIR/agentN.sock` over an in-process device on `link`
/// (MAC and address by `n`, `verbs_common::config`), in a thread.
pub fn agent(dir: &Path, n: u8, link: MemLink) -> AgentThread {
    let path = dir.join(format!("agent{n}.sock"));
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let (p, s) = (path.clone(), stop.clone());
    let thread = std::thread::spawn(move || {
        let pm = Arc::new(ProcessMemory::default());
        let t = LoopbackTransport::with_device_memory(config(n, 1500), Box::new(link), pm.clone())
            .expect("device");
        let mut a = Agent::new(Box::new(t), p, Some(pm), None).expect("agent");
        tx.send(a.ucma_stats()).unwrap();
        a.run(&s).expect("agent runs");
    });
    let ucma = rx.recv_timeout(DEADLINE).expect("agent up");
    AgentThread {
        path,
        ucma,
        stop,
        thread: Some(thread),
    }
}

/// A program on one side: verbs through its agent, and an event channel.
pub struct Prog {
    pub ctx: Context,
    pub pd: Pd,
    pub mr: Mr<'static>,
    pub cq: Cq,
    pub ch: UcmaConn,
}

/// A program of agent `a`'s function: a context, PD, 4 KiB MR and CQ
/// through the agent, and an event channel.
pub fn prog(a: &AgentThread) -> Prog {
    let t = AgentTransport::connect(&a.path).expect("verbs through the agent");
    let ctx = Context::open(Box::new(t)).expect("context");
    let pd = Pd::alloc(&ctx).unwrap();
    let mr = Mr::alloc(&pd, 4096, ACCESS_LOCAL_WRITE).unwrap();
    let cq = Cq::new(&ctx, 16).unwrap();
    let ch = UcmaConn::connect(&a.path).expect("an event channel");
    Prog {
        ctx,
        pd,
        mr,
        cq,
        ch,
    }
}
