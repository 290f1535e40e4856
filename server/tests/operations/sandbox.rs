//! `hypd serve --sandbox`: the test world comes up with the server, is announced, and
//! goes away with it, even when the server is killed.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::Hypd;
use serde_json::Value;

fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .parse()
        .unwrap()
}

fn closes_within(port: u16, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if TcpStream::connect(("127.0.0.1", port)).is_err() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
fn sandbox_serves_announces_and_dies_with_hypd() {
    let mut hypd = Hypd::start(&["--sandbox"], &[]);

    let ready = hypd.ready(false);
    assert_eq!(ready.status(), 200);
    let body: Value = ready.json().unwrap();
    assert_eq!(body["sandbox"], true);
    assert_eq!(body["aws"]["account"], "123456789012", "{body}");

    let html = hypd.get("/").text().unwrap();
    assert!(html.contains("sandbox-banner"), "{html}");
    assert!(html.contains("not to AWS"), "{html}");

    let log = hypd.stderr();
    assert!(log.contains("SANDBOX MODE"), "{log}");
    let moto_url = log
        .split("moto=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("moto url in the log")
        .to_owned();
    let sim_url = log
        .split("sim=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("sim url in the log")
        .to_owned();
    // The sandbox's admin token lives with its store, never in place of a real one.
    let dir = hypd.data_dir.path();
    assert!(dir.join("sandbox/admin-token").is_file());
    assert!(!dir.join("admin-token").exists());

    let sim_health: Value = reqwest::blocking::get(format!("{sim_url}/_sim/health"))
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(sim_health["ok"], true);

    // SIGKILL leaves hypd no chance to clean up: the kernel stops the world for it.
    hypd.child.kill().unwrap();
    hypd.child.wait().unwrap();
    assert!(
        closes_within(port_of(&moto_url), Duration::from_secs(10)),
        "moto outlived hypd"
    );
    assert!(
        closes_within(port_of(&sim_url), Duration::from_secs(10)),
        "sim outlived hypd"
    );
}
