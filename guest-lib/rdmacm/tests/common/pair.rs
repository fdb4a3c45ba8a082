//! Two functions of one daemon served in the test process (10.0.0.1 and
//! 10.0.0.2 on its embedded switch), a program on each, each function
//! through the agent vrnic's library starts: the harness of the tests of
//! Debian's rdma_cm programs (`tools.rs`, `middleware.rs`).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use vrnic::link::MemLink;
use vrnic_test_support::{which, AgentDir, Reaped};
use vrnic_vhost::addr::Ipv4Prefix;
use vrnic_vhost::functions::{FunctionSpec, Functions, FunctionsConfig};

fn function(dir: &Path, name: &str, last: u8) -> FunctionSpec {
    let mut s = FunctionSpec::new(
        dir.join(format!("{name}.sock")),
        Ipv4Prefix {
            addr: Ipv4Addr::new(10, 0, 0, last),
            len: 24,
        },
    );
    s.name = Some(name.to_string());
    s
}

/// Two functions of one daemon (10.0.0.1 and 10.0.0.2 on its switch) and
/// the libraries, for one test.
pub struct Pair {
    pub libs: PathBuf,
    pub a: FunctionSpec,
    pub b: FunctionSpec,
    _fns: Functions,
    pub agents: AgentDir,
    /// Environment added to both programs.
    pub env: Vec<(String, String)>,
    /// The network namespaces the programs run in, if any ([`Pair::netns`]).
    netns: Option<Netns>,
}

/// Two network namespaces joined by a veth pair whose ends carry the
/// functions' addresses (10.0.0.1 in the first, 10.0.0.2 in the second):
/// for programs that need an interface with their function's address
/// (`getifaddrs`, libfabric's verbs provider) or reach their peer over
/// TCP at its RDMA address (fi_pingpong's, qperf's control connection).
/// The RDMA traffic still crosses the daemon's switch. Removed on drop.
struct Netns {
    names: [String; 2],
    veths: [String; 2],
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {args:?}: {}", super::text(&out)))
    }
}

impl Netns {
    fn create(tag: &str) -> Result<Netns, String> {
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let base = format!("vrmw{}{n}", std::process::id());
        let veth = [format!("{base}a"), format!("{base}b")];
        let ns = Netns {
            names: [format!("{base}{tag}a"), format!("{base}{tag}b")],
            veths: veth.clone(),
        };
        for name in &ns.names {
            ip(&["netns", "add", name])?;
        }
        ip(&[
            "link",
            "add",
            &veth[0],
            "netns",
            &ns.names[0],
            "type",
            "veth",
            "peer",
            "name",
            &veth[1],
            "netns",
            &ns.names[1],
        ])?;
        for (i, (name, v)) in ns.names.iter().zip(&veth).enumerate() {
            let addr = format!("10.0.0.{}/24", i + 1);
            ip(&["-n", name, "addr", "add", &addr, "dev", v])?;
            ip(&["-n", name, "link", "set", v, "up"])?;
            ip(&["-n", name, "link", "set", "lo", "up"])?;
        }
        Ok(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = ip(&["netns", "del", n]);
        }
    }
}

/// Which function a program runs on.
#[derive(Clone, Copy)]
pub enum Side {
    A,
    B,
}

impl Pair {
    /// `None`, saying why, without `prog` or vrnic's libibverbs.
    pub fn new(tag: &str, prog: &str) -> Option<Pair> {
        if which(prog).is_none() {
            eprintln!("skipping: {prog} not installed (scripts/deps.sh)");
            return None;
        }
        let libs = super::vrnic_lib_dir(true)?;
        let agents = AgentDir::new(tag);
        let (uplink, _outside) = MemLink::pair();
        let fns = Functions::new(Box::new(uplink), FunctionsConfig::default());
        let (a, b) = (function(&agents.tmp, "a", 1), function(&agents.tmp, "b", 2));
        fns.add(&a).expect("function a");
        fns.add(&b).expect("function b");
        Some(Pair {
            libs,
            a,
            b,
            _fns: fns,
            agents,
            env: Vec::new(),
            netns: None,
        })
    }

    /// Runs the programs in two network namespaces of their own, joined
    /// by a veth pair carrying the functions' addresses (see [`Netns`]);
    /// `false`, saying why, when that cannot be done (not root).
    pub fn netns(&mut self, tag: &str) -> bool {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipping: network namespaces need root");
            return false;
        }
        match Netns::create(tag) {
            Ok(ns) => {
                self.netns = Some(ns);
                true
            }
            Err(e) => {
                eprintln!("skipping: cannot make the network namespaces: {e}");
                false
            }
        }
    }

    /// The name of the veth end that carries function `side`'s address
    /// in its namespace, if the programs run in namespaces.
    pub fn veth(&self, side: Side) -> Option<&str> {
        let i = matches!(side, Side::B) as usize;
        self.netns.as_ref().map(|n| n.veths[i].as_str())
    }

    /// `prog args` set up to run on function `side` through its agent, on
    /// vrnic's libraries, its output piped.
    pub fn command(&self, side: Side, prog: &str, args: &[&str]) -> Command {
        let sock = match side {
            Side::A => &self.a.socket,
            Side::B => &self.b.socket,
        };
        let mut c = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                let i = matches!(side, Side::B) as usize;
                c.args(["netns", "exec", &ns.names[i], prog]);
                c
            }
            None => Command::new(prog),
        };
        self.agents.env(&mut c);
        c.args(args)
            .env("LD_LIBRARY_PATH", &self.libs)
            .env("VRNIC_VHOST_USER", sock)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Waits (bounded) until both agents serve nobody.
    pub fn wait_agents_empty(&self) {
        self.wait_agent_empty(Side::A);
        self.wait_agent_empty(Side::B);
    }

    /// Waits (bounded) until the agent of function `side` serves nobody.
    pub fn wait_agent_empty(&self, side: Side) {
        let sock = match side {
            Side::A => &self.a.socket,
            Side::B => &self.b.socket,
        };
        let sock = self.agents.socket(sock);
        // An agent that has exited (its linger over, or never started)
        // removed its socket and holds nothing.
        if sock.exists() {
            AgentDir::wait_empty(&sock);
        }
    }

    /// `server` (program and arguments) on function a, then `client` on
    /// function b; returns their outputs. The client is started again
    /// (at most 50 times) while it fails saying one of `early` — nothing outside
    /// the agent shows when the server listens, and a client that comes
    /// too early is rejected (no listener) and gives up. A server that
    /// runs `forever` (cmtime's) is killed once the client is done, and
    /// only the client's exit status counts.
    pub fn run(
        &self,
        server: (&str, &[&str]),
        client: (&str, &[&str]),
        early: &[&str],
        forever: bool,
    ) -> (String, String) {
        let (cout, sout) = self.run_raw(server, client, early, forever);
        let (ct, st) = (super::text(&cout), super::text(&sout));
        assert!(
            cout.status.success() && (forever || sout.status.success()),
            "{} / {} failed: client {}:\n{ct}\nserver {}:\n{st}",
            server.0,
            client.0,
            cout.status,
            sout.status
        );
        self.wait_agents_empty();
        (ct, st)
    }

    /// As [`Pair::run`], but whatever their exit statuses: the client's
    /// and the server's outputs.
    pub fn run_raw(
        &self,
        server: (&str, &[&str]),
        client: (&str, &[&str]),
        early: &[&str],
        forever: bool,
    ) -> (Output, Output) {
        let srv = Reaped(Some(
            self.command(Side::A, server.0, server.1)
                .spawn()
                .expect("start the server"),
        ));
        let mut tries = 0;
        let cout = loop {
            tries += 1;
            let child = self
                .command(Side::B, client.0, client.1)
                .spawn()
                .expect("start the client");
            let out = Reaped(Some(child)).wait_bounded(Duration::from_secs(120));
            if out.status.success()
                || !early.iter().any(|e| super::text(&out).contains(e))
                || tries == 50
            {
                break out;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let sout = if forever {
            // A server that serves until killed: its client is done.
            srv.kill()
        } else {
            srv.wait_bounded(Duration::from_secs(60))
        };
        (cout, sout)
    }
}
