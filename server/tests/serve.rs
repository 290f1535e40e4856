//! `hypd serve` as a process: probes, metrics, the console page and logs, against moto
//! for AWS and SQLite or a real PostgreSQL for the store.

mod common;

use common::{Hypd, Moto, Postgres};
use serde_json::Value;

fn with_moto(moto: &Moto) -> Vec<(&'static str, String)> {
    moto.aws_env()
}

fn envs<'a>(pairs: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    pairs.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

#[test]
fn probes_metrics_and_console_against_moto() {
    let moto = Moto::start();
    let env = with_moto(&moto);
    let hypd = Hypd::start(&[], &envs(&env));

    let health = hypd.get("/healthz");
    assert_eq!(health.status(), 200);
    // The container's HEALTHCHECK command.
    let check = std::process::Command::new(common::hypd_bin())
        .args(["health", "--url", &hypd.url])
        .status()
        .unwrap();
    assert!(check.success());
    let down = format!("http://127.0.0.1:{}", common::free_port());
    let check = std::process::Command::new(common::hypd_bin())
        .args(["health", "--url", &down])
        .output()
        .unwrap();
    assert_eq!(check.status.code(), Some(1));

    let ready = hypd.get("/readyz");
    assert_eq!(ready.status(), 200);
    let body: Value = ready.json().unwrap();
    assert_eq!(body["ready"], true, "{body}");
    assert_eq!(body["store"]["backend"], "sqlite");
    // moto's fixed account id: the identity really came from STS.
    assert_eq!(body["aws"]["account"], "123456789012", "{body}");
    assert_eq!(body["aws"]["region"], "us-east-1");
    assert_eq!(body["sandbox"], false);

    let page = hypd.get("/");
    assert_eq!(page.status(), 200);
    let html = page.text().unwrap();
    assert!(html.contains("<title>hypd console</title>"), "{html}");
    assert!(
        html.contains("/pkg/hypd.js"),
        "hydration script missing: {html}"
    );
    assert!(html.contains("class=\"brand\""));
    assert!(
        !html.contains("sandbox-banner"),
        "no sandbox banner against AWS"
    );

    assert_eq!(hypd.get("/no/such/page").status(), 404);

    let metrics = hypd.get("/metrics");
    assert_eq!(metrics.status(), 200);
    let text = metrics.text().unwrap();
    for state in [
        "pending",
        "running",
        "waiting",
        "succeeded",
        "failed",
        "cancelled",
    ] {
        assert!(
            text.contains(&format!("hypd_operations{{state=\"{state}\"}} 0")),
            "{state}: {text}"
        );
    }
    assert!(
        text.contains(
            "hypd_http_requests_total{method=\"GET\",route=\"/readyz\",status=\"200\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.contains("hypd_http_request_duration_seconds_bucket"),
        "{text}"
    );

    // The data dir holds the store and is private to its owner.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(hypd.data_dir.path())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    assert!(hypd.data_dir.path().join("hypd.db").is_file());
}

#[test]
fn not_ready_when_aws_is_unreachable() {
    let port = common::free_port();
    let env = [
        ("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}")),
        ("AWS_ACCESS_KEY_ID", "testing".into()),
        ("AWS_SECRET_ACCESS_KEY", "testing".into()),
        ("AWS_REGION", "eu-west-1".into()),
    ];
    let hypd = Hypd::start(&[], &envs(&env));
    assert_eq!(
        hypd.get("/healthz").status(),
        200,
        "alive even when AWS is not"
    );
    let ready = hypd.get("/readyz");
    assert_eq!(ready.status(), 503);
    let body: Value = ready.json().unwrap();
    assert_eq!(body["store"]["ok"], true);
    assert_eq!(body["aws"]["ok"], false);
    assert_eq!(body["aws"]["error"]["service"], "sts");
    assert_eq!(body["aws"]["error"]["operation"], "GetCallerIdentity");
}

#[test]
fn json_logs_never_carry_secrets() {
    let moto = Moto::start();
    let mut env = with_moto(&moto);
    env.push(("HYPD_LOG_FORMAT", "json".into()));
    let hypd = Hypd::start(&[], &envs(&env));
    assert_eq!(hypd.get("/readyz").status(), 200);
    let log = hypd.stderr();
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty());
    for line in &lines {
        let v: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v["level"].is_string(), "{line}");
    }
    assert!(log.contains("hypd console listening"));
    assert!(
        !log.contains("testing\""),
        "credentials must not be logged: {log}"
    );
}

#[test]
fn postgres_store_is_used_when_configured() {
    let pg = Postgres::start();
    let moto = Moto::start();
    let mut env = with_moto(&moto);
    env.push(("HYPD_DATABASE_URL", pg.url.clone()));
    let hypd = Hypd::start(&[], &envs(&env));
    let body: Value = hypd.get("/readyz").json().unwrap();
    assert_eq!(body["store"]["backend"], "postgres", "{body}");
    assert_eq!(body["store"]["ok"], true, "{body}");
    assert!(!hypd.data_dir.path().join("hypd.db").exists());
    let metrics = hypd.get("/metrics").text().unwrap();
    assert!(
        metrics.contains("hypd_operations{state=\"failed\"} 0"),
        "{metrics}"
    );
}
