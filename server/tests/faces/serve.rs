//! `hypd serve` as a process: probes, metrics, the console page and logs, against moto
//! for AWS and SQLite or a real PostgreSQL for the store.

use crate::common::{Hypd, Moto, Postgres};
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
    let check = std::process::Command::new(crate::common::hypd_bin())
        .args(["health", "--url", &hypd.url])
        .status()
        .unwrap();
    assert!(check.success());
    let down = format!("http://127.0.0.1:{}", crate::common::free_port());
    let check = std::process::Command::new(crate::common::hypd_bin())
        .args(["health", "--url", &down])
        .output()
        .unwrap();
    assert_eq!(check.status.code(), Some(1));

    let ready = hypd.ready(false);
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
    let port = crate::common::free_port();
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
    assert_eq!(hypd.ready(false).status(), 200);
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
    let body: Value = hypd.ready(false).json().unwrap();
    assert_eq!(body["store"]["backend"], "postgres", "{body}");
    assert_eq!(body["store"]["ok"], true, "{body}");
    assert!(!hypd.data_dir.path().join("hypd.db").exists());
    let metrics = hypd.get("/metrics").text().unwrap();
    assert!(
        metrics.contains("hypd_operations{state=\"failed\"} 0"),
        "{metrics}"
    );
}

/// Whether the server closed `stream` (EOF or reset) before `limit`; a read that merely
/// times out means it is still open.
fn closed_by_server(stream: &mut std::net::TcpStream, limit: std::time::Duration) -> bool {
    use std::io::Read;
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            // An answer (a 408, say) before the close is fine: keep reading to the close.
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false;
            }
            Err(_) => return true,
        }
    }
}

/// A hundred connections that trickle a request head or send nothing at all are closed
/// by the header timeout, and a keep-alive connection left idle by the idle timeout;
/// meanwhile hypd keeps answering.
#[test]
fn slow_and_idle_connections_are_closed() {
    use std::io::Write;
    use std::net::TcpStream;
    use std::time::Duration;
    let moto = Moto::start();
    let mut env = with_moto(&moto);
    env.push(("HYPD_IDLE_TIMEOUT", "2".into()));
    let hypd = Hypd::start(&[], &envs(&env));
    let at = crate::common::authority(&hypd.url);

    let mut silent: Vec<TcpStream> = (0..50).map(|_| TcpStream::connect(&at).unwrap()).collect();
    let mut slow: Vec<TcpStream> = (0..50)
        .map(|_| {
            let mut s = TcpStream::connect(&at).unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                .unwrap();
            s
        })
        .collect();
    // One byte per connection every half second, never the end of the head.
    let writers: Vec<TcpStream> = slow.iter().map(|s| s.try_clone().unwrap()).collect();
    let trickle = std::thread::spawn(move || {
        let mut writers = writers;
        for _ in 0..120 {
            writers.retain_mut(|w| w.write_all(b"a").is_ok());
            if writers.is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    assert_eq!(
        hypd.get_anonymous("/healthz").status(),
        200,
        "served while they hang"
    );
    // The header timeout is 10 s; a minute is the bound of this test, not a measurement.
    for (i, s) in silent.iter_mut().chain(slow.iter_mut()).enumerate() {
        assert!(
            closed_by_server(s, Duration::from_secs(60)),
            "connection {i} is still open"
        );
    }
    trickle.join().unwrap();

    // A connection that sent one request and then nothing is closed once idle.
    let mut idle = TcpStream::connect(&at).unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let answer = crate::common::read_response(&mut idle).expect("an answer");
    assert_eq!(answer.status, 200);
    assert!(
        closed_by_server(&mut idle, Duration::from_secs(60)),
        "idle connection still open"
    );
    assert_eq!(hypd.get_anonymous("/healthz").status(), 200);
}

/// Past `--max-connections`, a connection is answered 503 in JSON and closed.
#[test]
fn connections_over_the_cap_get_503() {
    use std::net::TcpStream;
    let moto = Moto::start();
    let mut env = with_moto(&moto);
    env.push(("HYPD_MAX_CONNECTIONS", "3".into()));
    let hypd = Hypd::start(&[], &envs(&env));
    let at = crate::common::authority(&hypd.url);
    let held: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(&at).unwrap()).collect();
    let refused =
        crate::common::raw_request(&at, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    assert_eq!(refused.status, 503);
    assert_eq!(refused.json()["error"]["kind"], "unavailable");
    assert_eq!(refused.header("connection"), Some("close"));
    drop(held);
    // The held connections' slots come back once hypd sees them closed.
    let served = (0..100).any(|_| {
        let r = crate::common::raw_request(
            &at,
            "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        );
        r.status == 200 || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            false
        }
    });
    assert!(served, "slots were not released");
}

/// `/mcp` refuses a request without a token and the client may send its next request on
/// the same connection (the refused body is read, not left on the socket).
#[test]
fn a_refused_mcp_request_leaves_the_connection_usable() {
    use std::io::Write;
    let moto = Moto::start();
    let env = with_moto(&moto);
    let hypd = Hypd::start(&[], &envs(&env));
    let mut stream = std::net::TcpStream::connect(crate::common::authority(&hypd.url)).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    // Large enough not to arrive with the head: hyper skips a body it has already
    // buffered, but closes a connection whose body is still unread on the socket.
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{"pad":"{}"}}}}"#,
        "x".repeat(100_000)
    );
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let refused = crate::common::read_response(&mut stream).expect("an answer");
    assert_eq!(refused.status, 401);
    assert_eq!(refused.json()["error"]["kind"], "unauthorized");
    assert_ne!(refused.header("connection"), Some("close"));
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let next = crate::common::read_response(&mut stream).expect("the connection is still open");
    assert_eq!(next.status, 200);
}
