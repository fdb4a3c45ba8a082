//! `vrnic-probe`: smoke test of a vrnic device from inside a guest.
//!
//! Opens the device with the user-space virtio-pci driver
//! ([`vrnic_guest::pci::PciTransport`]), prints its configuration space,
//! then sends `CMD_QUERY_DEVICE`, `CMD_QUERY_PORT` (port 1) and
//! `CMD_QUERY_GID` (port 1, index 1) and prints the answers with their
//! round-trip times. Every failure is printed; the exit status is 0 only if
//! the device opened and all three commands succeeded. Needs root.
//!
//! Output is line-oriented `key: value` so a test harness can grep it; the
//! last line is `probe: ok` or `probe: FAILED (n errors)`.

use std::net::Ipv6Addr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use vrnic::abi::{self, command, Command, Pod};
use vrnic_guest::pci::PciTransport;
use vrnic_guest::transport::{Transport, TransportError};

/// Probe a vrnic device: print its configuration and query device, port and GID.
#[derive(Parser, Debug)]
#[command(name = "vrnic-probe", version)]
struct Args {
    /// PCI address of the device (e.g. 0000:00:04.0); default: the first vrnic found.
    #[arg(long)]
    bdf: Option<String>,
    /// GID table index to query.
    #[arg(long, default_value_t = 1)]
    gid_index: u32,
    /// Bound on each control command, milliseconds.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
}

fn mac(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn mtu(m: u32) -> String {
    match abi::mtu_bytes(m) {
        Some(b) => format!("{m} ({b} bytes)"),
        None => format!("{m} (invalid)"),
    }
}

fn print_config(c: &abi::ConfigSpace) {
    println!(
        "config.signature: {:?}",
        String::from_utf8_lossy(&c.signature).trim_end_matches('\0')
    );
    println!("config.abi_version: {}", c.abi_version);
    println!("config.num_queues: {}", c.num_queues);
    println!("config.phys_port_cnt: {}", c.phys_port_cnt);
    println!("config.active_mtu: {}", mtu(c.active_mtu.into()));
    println!("config.mac: {}", mac(&c.mac));
    println!("config.max_qp: {}", c.max_qp);
    println!("config.max_cq: {}", c.max_cq);
    println!("config.max_mr: {}", c.max_mr);
    println!("config.max_pd: {}", c.max_pd);
    println!("config.max_qp_wr: {}", c.max_qp_wr);
    println!("config.max_cqe: {}", c.max_cqe);
    println!("config.max_sge: {}", c.max_sge);
    println!("config.max_inline: {}", c.max_inline);
}

/// Runs command `C` with `req` and decodes its response.
fn query<C: Command>(
    t: &mut PciTransport,
    name: &str,
    req: &C::Request,
) -> Result<C::Response, String> {
    let mut resp = [0u8; abi::MAX_CMD_BODY];
    let start = Instant::now();
    let r = t.command(C::OPCODE, req.as_bytes(), &mut resp);
    let us = start.elapsed().as_micros();
    match r {
        Ok(n) => {
            println!("{name}.round_trip_us: {us}");
            C::Response::read_from(&resp[..n]).ok_or_else(|| {
                format!(
                    "{name}: response of {n} bytes, expected {}",
                    size_of::<C::Response>()
                )
            })
        }
        Err(e) => Err(format!("{name}: {e}")),
    }
}

fn run(args: &Args, errors: &mut Vec<String>) -> Result<(), TransportError> {
    let mut t = PciTransport::open(args.bdf.as_deref())?;
    t.set_timeout(Duration::from_millis(args.timeout_ms));
    println!("device.bdf: {}", t.bdf());
    let [cq, dq, eq] = t.queue_sizes();
    println!("device.queue_sizes: control={cq} doorbell={dq} event={eq}");
    println!("device.dma: {:?}", t.dma_mode());
    println!(
        "device.interrupt: {}",
        if t.has_interrupt() {
            "INTx via uio_pci_generic (event queue)"
        } else {
            "none (events polled)"
        }
    );
    let c = t.config();
    print_config(&c);

    match query::<command::QueryDevice>(&mut t, "query_device", &()) {
        Ok(a) => {
            println!(
                "query_device.node_guid: {}",
                a.node_guid.map(|b| format!("{b:02x}")).concat()
            );
            println!("query_device.max_mr_size: {}", a.max_mr_size);
            println!("query_device.page_size_cap: {:#x}", a.page_size_cap);
            println!("query_device.max_qp: {}", a.max_qp);
            println!("query_device.max_qp_wr: {}", a.max_qp_wr);
            println!("query_device.max_sge: {}", a.max_sge);
            println!("query_device.max_cq: {}", a.max_cq);
            println!("query_device.max_cqe: {}", a.max_cqe);
            println!("query_device.max_mr: {}", a.max_mr);
            println!("query_device.max_pd: {}", a.max_pd);
            println!("query_device.max_qp_rd_atom: {}", a.max_qp_rd_atom);
            println!(
                "query_device.max_qp_init_rd_atom: {}",
                a.max_qp_init_rd_atom
            );
            println!("query_device.max_inline: {}", a.max_inline);
            println!("query_device.max_srq: {}", a.max_srq);
            println!("query_device.max_srq_wr: {}", a.max_srq_wr);
            println!("query_device.max_srq_sge: {}", a.max_srq_sge);
            println!("query_device.max_ah: {}", a.max_ah);
            println!("query_device.max_mr_pages: {}", a.max_mr_pages);
            println!("query_device.max_total_mr_pages: {}", a.max_total_mr_pages);
            println!("query_device.max_total_wr: {}", a.max_total_wr);
        }
        Err(e) => errors.push(e),
    }

    let body = abi::QueryPort {
        port: 1,
        reserved: 0,
    };
    match query::<command::QueryPort>(&mut t, "query_port", &body) {
        Ok(p) => {
            let state = match p.state {
                1 => "DOWN",
                2 => "INIT",
                3 => "ARMED",
                4 => "ACTIVE",
                5 => "ACTIVE_DEFER",
                _ => "?",
            };
            println!("query_port.state: {} ({state})", p.state);
            println!("query_port.max_mtu: {}", mtu(p.max_mtu));
            println!("query_port.active_mtu: {}", mtu(p.active_mtu));
            println!("query_port.gid_tbl_len: {}", p.gid_tbl_len);
            println!("query_port.max_msg_sz: {}", p.max_msg_sz);
            let ll = if p.link_layer == 2 { "Ethernet" } else { "?" };
            println!("query_port.link_layer: {} ({ll})", p.link_layer);
        }
        Err(e) => errors.push(e),
    }

    let body = abi::QueryGid {
        port: 1,
        index: args.gid_index,
    };
    match query::<command::QueryGid>(&mut t, "query_gid", &body) {
        Ok(g) => {
            println!("query_gid.index: {}", args.gid_index);
            println!("query_gid.gid: {}", Ipv6Addr::from(g.gid));
            let ty = if g.gid_type == abi::GID_TYPE_ROCE_V2 {
                "RoCEv2"
            } else {
                "?"
            };
            println!("query_gid.type: {} ({ty})", g.gid_type);
        }
        Err(e) => errors.push(e),
    }
    Ok(())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let mut errors = Vec::new();
    if let Err(e) = run(&args, &mut errors) {
        errors.push(format!("open: {e}"));
    }
    for e in &errors {
        eprintln!("error: {e}");
    }
    if errors.is_empty() {
        println!("probe: ok");
        ExitCode::SUCCESS
    } else {
        println!("probe: FAILED ({} errors)", errors.len());
        ExitCode::FAILURE
    }
}
