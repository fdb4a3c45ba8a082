//! The workspace's crate layers (docs/ARCHITECTURE.md, "Layers"): which
//! vrnic crate may depend on which, checked from `cargo metadata` so that a
//! new back edge fails `cargo test` and names the rule it breaks (issue 29).
//!
//! Only normal and build dependencies count; dev-dependencies may point
//! anywhere (the daemon's integration tests use the test frontend and the
//! guest library). An optional dependency counts as "behind a feature".

use std::collections::BTreeMap;
use std::process::Command;

/// One crate rule: `krate` must not depend on any of `forbidden`
/// (`optional_ok`: unless the dependency is optional, i.e. behind a feature).
struct Rule {
    name: &'static str,
    krate: &'static str,
    forbidden: &'static [&'static str],
    optional_ok: bool,
    why: &'static str,
}

const RULES: &[Rule] = &[
    Rule {
        name: "abi-is-the-bottom",
        krate: "vrnic-abi",
        forbidden: &["vrnic", "vrnic-vhost", "vrnic-guest", "vrnic-virtq", "vrnic-frontend"],
        optional_ok: false,
        why: "the device ABI is what engine, daemon, driver and library share; it depends on none of them",
    },
    Rule {
        name: "wire-is-bytes-only",
        krate: "vrnic-wire",
        forbidden: &["vrnic", "vrnic-abi", "vrnic-vhost", "vrnic-guest", "vrnic-virtq", "vrnic-frontend", "vrnic-tools"],
        optional_ok: false,
        why: "the wire formats are RoCEv2's and IBTA's bytes, shared by the engine and the driver side's connection manager; they know nothing of vrnic",
    },
    Rule {
        name: "cm-on-wire-only",
        krate: "vrnic-cm",
        forbidden: &["vrnic", "vrnic-abi", "vrnic-vhost", "vrnic-guest", "vrnic-virtq", "vrnic-frontend", "vrnic-tools", "vrnic-ibverbs", "vrnic-rdmacm"],
        optional_ok: false,
        why: "the IB CM is a sans-IO state machine over the CM MADs (vrnic-wire) that the driver side's agent drives; it knows neither the engine nor the device ABI",
    },
    Rule {
        name: "engine-below-daemon-and-driver",
        krate: "vrnic",
        forbidden: &["vrnic-vhost", "vrnic-guest", "vrnic-virtq", "vrnic-frontend", "vrnic-tools"],
        optional_ok: false,
        why: "the RNIC engine knows nothing of how a driver reaches it",
    },
    Rule {
        name: "virtqueue-stands-alone",
        krate: "vrnic-virtq",
        forbidden: &["vrnic", "vrnic-abi", "vrnic-vhost", "vrnic-guest", "vrnic-frontend"],
        optional_ok: false,
        why: "the driver-side split virtqueue is virtio 1.2 §2.7 and nothing of vrnic",
    },
    Rule {
        name: "daemon-not-on-driver",
        krate: "vrnic-vhost",
        forbidden: &["vrnic-guest", "vrnic-frontend", "vrnic-tools"],
        optional_ok: false,
        why: "the daemon is the device side; drivers and test frontends depend on it, not the reverse",
    },
    Rule {
        name: "driver-on-abi-not-engine",
        krate: "vrnic-guest",
        forbidden: &["vrnic", "vrnic-vhost", "vrnic-frontend"],
        optional_ok: true,
        why: "the guest driver speaks the device ABI; only the in-process loopback device (a feature) links the engine",
    },
    Rule {
        name: "ibverbs-on-abi-not-engine",
        krate: "vrnic-ibverbs",
        forbidden: &["vrnic", "vrnic-vhost", "vrnic-frontend"],
        optional_ok: true,
        why: "libibverbs.so.1 is a driver library over vrnic-guest; only the in-process loopback device (a feature) links the engine",
    },
];

/// `package name -> [(dependency name, kind, optional)]` of the workspace's
/// members, from `cargo metadata --no-deps`.
type Deps = BTreeMap<String, Vec<(String, String, bool)>>;

fn workspace_deps() -> Deps {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("cargo metadata JSON");
    let mut deps = Deps::new();
    for pkg in meta["packages"].as_array().expect("packages") {
        let name = pkg["name"].as_str().expect("name").to_string();
        let list = pkg["dependencies"]
            .as_array()
            .expect("dependencies")
            .iter()
            .map(|d| {
                (
                    d["name"].as_str().expect("dep name").to_string(),
                    d["kind"].as_str().unwrap_or("normal").to_string(),
                    d["optional"].as_bool().unwrap_or(false),
                )
            })
            .collect();
        deps.insert(name, list);
    }
    deps
}

/// What `deps` breaks of `rules`, one line per offending edge.
fn violations(deps: &Deps, rules: &[Rule]) -> Vec<String> {
    let mut bad = Vec::new();
    for rule in rules {
        let Some(list) = deps.get(rule.krate) else {
            continue;
        };
        for (dep, kind, optional) in list {
            if kind == "dev" || !rule.forbidden.contains(&dep.as_str()) {
                continue;
            }
            if *optional && rule.optional_ok {
                continue;
            }
            bad.push(format!(
                "{} -> {dep} ({kind}{}) breaks rule {}: {}",
                rule.krate,
                if *optional { ", optional" } else { "" },
                rule.name,
                rule.why
            ));
        }
    }
    bad
}

#[test]
fn workspace_crates_depend_only_downwards() {
    let deps = workspace_deps();
    for rule in RULES {
        assert!(
            deps.contains_key(rule.krate),
            "rule {} names crate {}, which is not a workspace member",
            rule.name,
            rule.krate
        );
    }
    let bad = violations(&deps, RULES);
    assert!(
        bad.is_empty(),
        "crate layer violations:\n{}",
        bad.join("\n")
    );
}

#[test]
fn a_back_edge_is_named_by_its_rule() {
    let mut deps = Deps::new();
    deps.insert(
        "vrnic-vhost".into(),
        vec![("vrnic-guest".into(), "normal".into(), false)],
    );
    deps.insert(
        "vrnic-guest".into(),
        vec![
            ("vrnic".into(), "normal".into(), true),
            ("vrnic-frontend".into(), "dev".into(), false),
        ],
    );
    let bad = violations(&deps, RULES);
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(bad[0].contains("daemon-not-on-driver"), "{}", bad[0]);
    // A non-optional engine dependency of the driver is a violation too.
    deps.insert(
        "vrnic-guest".into(),
        vec![("vrnic".into(), "normal".into(), false)],
    );
    let bad = violations(&deps, RULES);
    assert!(
        bad.iter().any(|b| b.contains("driver-on-abi-not-engine")),
        "{bad:?}"
    );
}
