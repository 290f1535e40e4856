//! REST against a real `hypd` and moto: the first admin token, inspection answers built
//! from EC2, stored reads, long-polling an operation, and token roles.

use std::time::{Duration, Instant};

use crate::common::{Hypd, Moto};
use reqwest::blocking::Client;
use serde_json::{Value, json};

struct Api {
    hypd: Hypd,
    token: String,
    http: Client,
    _moto: Moto,
}

impl Api {
    fn start() -> Api {
        Api::start_with(&[])
    }

    /// A hypd with `extra` variables on top of moto's.
    fn start_with(extra: &[(&str, &str)]) -> Api {
        let moto = Moto::start();
        let env = moto.aws_env();
        let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        env.extend_from_slice(extra);
        let hypd = Hypd::start(&[], &env);
        let token = hypd.admin_token();
        Api {
            hypd,
            token,
            http: Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
            _moto: moto,
        }
    }

    /// Any request as `token`: status, headers and the JSON body (`Null` if not JSON).
    fn send(
        &self,
        token: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.hypd.url))
            .bearer_auth(token);
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b);
        }
        let r = req.send().unwrap();
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let text = r.text().unwrap();
        (
            status,
            headers,
            serde_json::from_str(&text).unwrap_or(Value::Null),
        )
    }

    fn create_token(&self, name: &str, role: &str) -> String {
        let (status, created) = self.post("/api/v1/tokens", json!({"name": name, "role": role}));
        assert_eq!(status, 200, "{created}");
        created["token"].as_str().unwrap().to_owned()
    }

    fn audit_requests(&self) -> Vec<(String, String, String)> {
        let db = self.hypd.data_dir.path().join("hypd.db");
        let out = std::process::Command::new("python3")
            .args([
                "-c",
                "import sqlite3,sys,json; c=sqlite3.connect(sys.argv[1]); \
                 print(json.dumps(c.execute('SELECT actor, command, request FROM audit_log ORDER BY at').fetchall()))",
            ])
            .arg(&db)
            .output()
            .unwrap();
        assert!(out.status.success());
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn get(&self, path: &str) -> (u16, Value) {
        self.get_as(&self.token, path)
    }

    fn get_as(&self, token: &str, path: &str) -> (u16, Value) {
        let r = self
            .http
            .get(format!("{}{path}", self.hypd.url))
            .bearer_auth(token)
            .send()
            .unwrap();
        (r.status().as_u16(), r.json().unwrap_or(Value::Null))
    }

    fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.hypd.url))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .unwrap();
        (r.status().as_u16(), r.json().unwrap_or(Value::Null))
    }

    /// Writes an operation row directly, as the engine would.
    fn insert_operation(&self, id: &str, state: &str) {
        let written = self.hypd.sql(&format!(
            "INSERT INTO operations (id, command, target, state, created_at, updated_at) VALUES ('{id}', 'create_cluster', 'cluster/ml-1', '{state}', '2026-01-01T00:00:00.000Z', '2026-01-01T00:00:00.000Z')"
        ));
        assert_eq!(written, 1);
    }
}

#[test]
fn first_start_prints_and_stores_the_admin_token_once() {
    let api = Api::start();
    assert!(api.token.starts_with("hypd_"));
    let (status, who) = api.get("/api/v1/whoami");
    assert_eq!(status, 200, "{who}");
    assert_eq!(who["account"], "123456789012");
    assert_eq!(who["role"], "admin");
    assert_eq!(who["token_name"], "admin");
    assert_eq!(who["sandbox"], false);
}

#[test]
fn without_a_warm_up_the_catalogue_is_read_when_first_asked() {
    let api = Api::start_with(&[("HYPD_WARM_CATALOGUE", "false")]);
    let (status, zones) = api.get("/api/v1/availability-zones");
    assert_eq!(status, 200, "{zones}");
    assert_eq!(zones["freshness"]["cached"], false);
    // A warm-up takes about a second against moto; given two, one would have logged.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let log = api.hypd.stderr();
    assert!(
        !log.contains("inspection cache warmed") && !log.contains("could not warm"),
        "{log}"
    );
}

#[test]
fn inspection_comes_from_ec2_and_is_cached_with_freshness() {
    let api = Api::start();
    let (status, zones) = api.get("/api/v1/availability-zones");
    assert_eq!(status, 200, "{zones}");
    assert_eq!(zones["region"], "us-east-1");
    let names: Vec<&str> = zones["zones"]
        .as_array()
        .unwrap()
        .iter()
        .map(|z| z["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"us-east-1a"), "{names:?}");
    let (_, fresh) = api.get("/api/v1/availability-zones?refresh=true");
    assert_eq!(fresh["freshness"]["cached"], false);

    // hypd warms its own region's answers at start, so the cache is first seen cold in
    // another region.
    let (_, other) = api.get("/api/v1/availability-zones?region=eu-west-1");
    assert_eq!(other["region"], "eu-west-1");
    assert_eq!(other["freshness"]["cached"], false);
    let (_, again) = api.get("/api/v1/availability-zones?region=eu-west-1");
    assert_eq!(again["freshness"]["cached"], true);
    assert!(
        other["zones"][0]["name"]
            .as_str()
            .unwrap()
            .starts_with("eu-west-1")
    );

    let (status, types) = api.get("/api/v1/instance-types?availability_zone=us-east-1a");
    assert_eq!(status, 200, "{types}");
    let list = types["instance_types"].as_array().unwrap();
    assert!(
        list.iter().all(|t| !t["accelerator"].is_null()),
        "accelerated only by default"
    );
    let p5 = list
        .iter()
        .find(|t| t["instance_type"] == "p5.48xlarge")
        .expect("p5.48xlarge offered");
    assert_eq!(p5["accelerator"]["name"], "H100");
    assert_eq!(p5["accelerator"]["count"], 8);
    assert_eq!(p5["max_efa_interfaces"], 32);
    assert_eq!(p5["efa_only_allowed"], true);
    let g6 = list
        .iter()
        .find(|t| t["instance_type"] == "g6.48xlarge")
        .expect("g6.48xlarge");
    assert_eq!(g6["efa_only_allowed"], false, "ineligible family");
    let small = list
        .iter()
        .find(|t| t["instance_type"] == "p5.4xlarge")
        .expect("p5.4xlarge");
    assert_eq!(small["efa_only_allowed"], false, "one EFA card");
    let (_, trn) = api.get("/api/v1/instance-types?instance_types=trn1.32xlarge");
    assert_eq!(
        trn["instance_types"][0]["accelerator"]["kind"], "trainium",
        "{trn}"
    );
    assert!(list.iter().all(|t| {
        t["offered_in"]
            .as_array()
            .unwrap()
            .iter()
            .any(|z| z == "us-east-1a")
    }));

    // Asking for fewer fields sends only those (and the name), for the same types.
    let (status, cut) = api.get(
        "/api/v1/instance-types?availability_zone=us-east-1a&fields=accelerator&fields=offered_in",
    );
    assert_eq!(status, 200, "{cut}");
    let cut = cut["instance_types"].as_array().unwrap();
    assert_eq!(cut.len(), list.len());
    for (short, whole) in cut.iter().zip(list) {
        let keys: Vec<&String> = short.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            ["accelerator", "instance_type", "offered_in"],
            "{short}"
        );
        assert_eq!(short["accelerator"], whole["accelerator"]);
    }
    let (status, bad) = api.get("/api/v1/instance-types?fields=price");
    assert_eq!(status, 422, "{bad}");
    assert_eq!(bad["error"]["errors"][0]["field"], "fields[0]", "{bad}");

    let (status, all) = api.get("/api/v1/instance-types?accelerated_only=false");
    assert_eq!(status, 200);
    let all = all["instance_types"].as_array().unwrap();
    assert!(all.len() > list.len());
    assert!(
        all.iter()
            .any(|t| t["accelerator"].is_null() && t["vcpus"].as_u64() > Some(0))
    );

    let (_, regions) = api.get("/api/v1/regions");
    assert!(
        regions["regions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "ap-southeast-2")
    );
}

#[test]
fn bad_inputs_name_the_field() {
    let api = Api::start();
    let (status, body) = api.get("/api/v1/instance-types?availability_zone=eu-west-1a");
    assert_eq!(status, 422);
    assert_eq!(body["error"]["errors"][0]["field"], "availability_zone");
    assert!(
        body["error"]["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("us-east-1a"),
        "{body}"
    );

    let (status, body) = api.get("/api/v1/availability-zones?region=mars");
    assert_eq!(status, 422);
    assert_eq!(body["error"]["errors"][0]["field"], "region");

    let (status, body) = api.get("/api/v1/instance-types?region=an-cjk-1");
    assert_eq!(
        status, 422,
        "a well-formed region the account lacks: {body}"
    );
    assert_eq!(body["error"]["errors"][0]["field"], "region");
    assert!(
        body["error"]["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("us-east-1")
    );

    let (status, body) = api.get("/api/v1/regions?colour=blue");
    assert_eq!(status, 422);
    assert_eq!(body["error"]["errors"][0]["field"], "colour");

    let (status, body) = api.post(
        "/api/v1/tokens",
        json!({"name": "ci bot", "role": "viewer"}),
    );
    assert_eq!(status, 422);
    assert_eq!(body["error"]["errors"][0]["field"], "name");
    let (status, body) = api.post("/api/v1/tokens", json!({"name": "ci", "role": "root"}));
    assert_eq!(status, 422);
    assert_eq!(body["error"]["errors"][0]["field"], "role");
}

#[test]
fn stored_reads_and_not_found() {
    let api = Api::start();
    assert_eq!(api.get("/api/v1/clusters"), (200, json!({"clusters": []})));
    let (status, body) = api.get("/api/v1/clusters/ml-1");
    assert_eq!(status, 404);
    assert_eq!(body["error"]["kind"], "not_found");
    assert_eq!(
        api.get("/api/v1/operations"),
        (200, json!({"operations": []}))
    );
    let (status, _) = api.get("/api/v1/operations/nope");
    assert_eq!(status, 404);
}

#[test]
fn wait_operation_returns_at_a_final_state_or_the_timeout() {
    let api = Api::start();
    api.insert_operation("op-done", "succeeded");
    api.insert_operation("op-busy", "running");

    let start = Instant::now();
    let (status, done) = api.get("/api/v1/operations/op-done/wait");
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["timed_out"], false);
    assert_eq!(done["operation"]["state"], "succeeded");
    assert!(start.elapsed() < Duration::from_secs(5));

    let start = Instant::now();
    let (_, busy) = api.get("/api/v1/operations/op-busy/wait?timeout_seconds=1");
    assert_eq!(busy["timed_out"], true);
    assert_eq!(busy["operation"]["state"], "running");
    assert!(start.elapsed() >= Duration::from_secs(1));

    let (_, list) = api.get("/api/v1/operations?state=running");
    let ids: Vec<&str> = list["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["operation_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["op-busy"]);
    let (_, list) = api.get("/api/v1/operations?target=cluster%2Fml-1");
    assert_eq!(list["operations"].as_array().unwrap().len(), 2);
}

#[test]
fn tokens_roles_and_revocation() {
    let api = Api::start();
    let (status, created) = api.post(
        "/api/v1/tokens",
        json!({"name": "agent", "role": "operator"}),
    );
    assert_eq!(status, 200, "{created}");
    let agent = created["token"].as_str().unwrap().to_owned();
    assert_eq!(api.get_as(&agent, "/api/v1/whoami").1["role"], "operator");
    // An operator cannot manage tokens.
    assert_eq!(api.get_as(&agent, "/api/v1/tokens").0, 403);
    let (status, _) = api.post("/api/v1/tokens", json!({"name": "agent", "role": "viewer"}));
    assert_eq!(status, 409, "names are unique");

    let (status, revoked) = api.hypd.confirmed(
        &api.token,
        reqwest::Method::DELETE,
        "/api/v1/tokens/agent",
        None,
    );
    assert_eq!(status, 200, "{revoked}");
    assert!(revoked["revoked_at"].is_string(), "{revoked}");
    assert_eq!(
        api.get_as(&agent, "/api/v1/whoami").0,
        401,
        "revoked at once"
    );

    let r = api
        .http
        .delete(format!("{}/api/v1/tokens/admin", api.hypd.url))
        .bearer_auth(&api.token)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 422, "a token cannot revoke itself");
    let (_, tokens) = api.get("/api/v1/tokens");
    let listed = tokens.to_string();
    assert!(
        !listed.contains(&agent) && !listed.contains(&api.token),
        "secrets are never listed"
    );
}

/// The console's server function answers an error with the status REST gives it, and
/// the same body.
#[test]
fn the_console_call_path_answers_with_rest_statuses() {
    let api = Api::start();
    let (_, created) = api.post(
        "/api/v1/tokens",
        json!({"name": "looker", "role": "viewer"}),
    );
    let viewer = created["token"].as_str().unwrap().to_owned();
    let run = |token: &str, command: &str, input: Value| {
        let r = api
            .http
            .post(format!("{}/fn/run_command", api.hypd.url))
            .bearer_auth(token)
            .json(&json!({"command": command, "input": input}))
            .send()
            .unwrap();
        (
            r.status().as_u16(),
            r.json::<Value>().unwrap_or(Value::Null),
        )
    };
    let (status, ok) = run(&api.token, "list_clusters", json!({}));
    assert_eq!((status, &ok), (200, &json!({"clusters": []})));
    let (status, bad) = run(&api.token, "get_cluster", json!({"name": "bad_name"}));
    assert_eq!(status, 422, "{bad}");
    assert_eq!(bad["errors"][0]["field"], "name");
    let (status, missing) = run(&api.token, "get_cluster", json!({"name": "nope"}));
    assert_eq!((status, missing["kind"].as_str()), (404, Some("not_found")));
    let (status, refused) = run(
        &viewer,
        "create_cluster",
        json!({"name": "ml-1", "availability_zone": "us-east-1a",
               "instance_groups": [{"name": "gpu", "instance_type": "ml.g5.8xlarge", "instance_count": 1}]}),
    );
    assert_eq!((status, refused["kind"].as_str()), (403, Some("forbidden")));
    let (status, _) = run("hypd_wrong", "list_clusters", json!({}));
    assert_eq!(status, 401);
}

#[test]
fn second_start_keeps_the_first_token() {
    let moto = Moto::start();
    let env = moto.aws_env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let dir = tempfile::tempdir().unwrap();
    let first = {
        let mut cmd = crate::common::hypd_command(dir.path());
        cmd.args(["serve"]).envs(env.iter().copied());
        let out = run_until_listening(cmd);
        assert!(out.contains("admin token hypd_"), "{out}");
        std::fs::read_to_string(dir.path().join("admin-token")).unwrap()
    };
    let mut cmd = crate::common::hypd_command(dir.path());
    cmd.args(["serve"]).envs(env.iter().copied());
    let out = run_until_listening(cmd);
    assert!(!out.contains("admin token"), "printed only once: {out}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("admin-token")).unwrap(),
        first
    );
}

/// Runs hypd until it listens, stops it, and returns what it printed on stdout.
fn run_until_listening(mut cmd: std::process::Command) -> String {
    use std::io::{BufRead, BufReader};
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = String::new();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
        out.push_str(&line);
        if line.starts_with("hypd listening on") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    out
}

/// `?role=admin` beside `{"role": "viewer"}` used to make an admin token: a field given
/// in two places is now that field's error, and nothing is created.
#[test]
fn a_field_given_in_two_places_is_refused() {
    let api = Api::start();
    let (status, _, body) = api.send(
        &api.token,
        reqwest::Method::POST,
        "/api/v1/tokens?role=admin",
        Some(br#"{"name": "sneaky", "role": "viewer"}"#.to_vec()),
    );
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["errors"][0]["field"], "role");
    assert_eq!(
        body["error"]["errors"][0]["message"],
        "given in both the query string and the body: send it in one place"
    );
    let (_, tokens) = api.get("/api/v1/tokens");
    assert!(!tokens.to_string().contains("sneaky"), "{tokens}");

    let (status, _, body) = api.send(
        &api.token,
        reqwest::Method::DELETE,
        "/api/v1/tokens/admin2",
        Some(br#"{"name": "other"}"#.to_vec()),
    );
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["errors"][0]["field"], "name");
    assert!(
        body["error"]["errors"][0]["message"]
            .as_str()
            .unwrap()
            .starts_with("given in both the path and the body")
    );

    let (status, body) = api.get("/api/v1/instance-types?refresh=true&refresh=false");
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["errors"][0]["field"], "refresh");
    let (status, body) = api.get("/api/v1/operations/op-1/wait?operation_id=op-2");
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["errors"][0]["field"], "operation_id");
}

/// Refusals made below the commands (body size, path decoding, routing) are JSON too.
#[test]
fn every_refusal_is_json() {
    let api = Api::start();
    // Announced as 10 MB and refused before a byte of it is sent (curl waits for
    // `100 Continue` before a large upload).
    let r = crate::common::raw_request(
        &crate::common::authority(&api.hypd.url),
        &format!(
            "POST /api/v1/clusters HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n\
             Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
            api.token,
            10 << 20
        ),
    );
    assert_eq!(r.status, 413);
    let body = r.json();
    assert_eq!(body["error"]["kind"], "too_large", "{body}");
    assert_eq!(body["error"]["limit_bytes"], 1 << 20);
    assert_eq!(
        r.header("connection"),
        Some("close"),
        "the unread body ends the connection"
    );

    let (status, _, body) = api.send(
        &api.token,
        reqwest::Method::GET,
        "/api/v1/clusters/%FF",
        None,
    );
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["errors"][0]["field"], "name");
    assert_eq!(
        body["error"]["errors"][0]["message"],
        "is not valid UTF-8 once percent-decoded"
    );

    let (status, _, body) = api.send(
        &api.token,
        reqwest::Method::GET,
        "/api/v1/no-such-thing",
        None,
    );
    assert_eq!(status, 404);
    assert_eq!(body["error"]["kind"], "not_found", "{body}");
    let (status, _, body) = api.send(&api.token, reqwest::Method::PUT, "/api/v1/clusters", None);
    assert_eq!(status, 405);
    assert_eq!(body["error"]["kind"], "not_found", "{body}");
}

/// Values are bounded at the field, and an error quotes at most the start of a value:
/// a 900 kB name gets an error of a few hundred bytes, and an audited refusal stores a
/// few kB, whoever sent it.
#[test]
fn long_values_get_short_errors_and_short_audit_rows() {
    let api = Api::start();
    let long = "a".repeat(900 * 1024);
    let request = serde_json::to_vec(&json!({"name": long, "role": "viewer"})).unwrap();
    let r = api
        .http
        .post(format!("{}/api/v1/tokens", api.hypd.url))
        .bearer_auth(&api.token)
        .header("content-type", "application/json")
        .body(request.clone())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 422);
    let text = r.text().unwrap();
    assert!(text.len() < 1024, "{} bytes: {}", text.len(), &text[..200]);
    let error: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(error["error"]["errors"][0]["field"], "name");
    assert!(
        error["error"]["errors"][0]["message"]
            .as_str()
            .unwrap()
            .ends_with("… (921600 characters))"),
        "{text}"
    );

    let long_id = "o".repeat(129);
    let (status, body) = api.get(&format!("/api/v1/operations/{long_id}"));
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["errors"][0]["field"], "operation_id");

    // A viewer's refused request is audited, cut to a few kB and marked.
    let viewer = api.create_token("looker", "viewer");
    let (status, _, refused) = api.send(
        &viewer,
        reqwest::Method::POST,
        "/api/v1/tokens",
        Some(request),
    );
    assert_eq!(status, 403, "{refused}");
    let rows = api.audit_requests();
    let (_, _, stored) = rows
        .iter()
        .find(|(actor, command, _)| actor == "looker" && command == "create_token")
        .expect("the refusal is audited");
    assert!(stored.len() < 9 * 1024, "{} bytes", stored.len());
    assert!(
        stored.contains("…[truncated: 921600 bytes in all]"),
        "{stored}"
    );

    // Over the body limit nothing is read, so nothing is audited.
    let r = crate::common::raw_request(
        &crate::common::authority(&api.hypd.url),
        &format!(
            "POST /api/v1/tokens HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {viewer}\r\n\
             Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
            1536 * 1024
        ),
    );
    assert_eq!(r.status, 413);
    assert_eq!(api.audit_requests().len(), rows.len());
}

/// A token that sends faster than its rate is answered 429 with Retry-After; others are
/// not slowed by it.
#[test]
fn a_token_over_its_rate_gets_429_with_retry_after() {
    let api = Api::start_with(&[("HYPD_RATE_LIMIT", "1")]);
    let busy = api.create_token("busy", "viewer");
    let calm = api.create_token("calm", "viewer");
    let limited = (0..30)
        .map(|_| api.send(&busy, reqwest::Method::GET, "/api/v1/clusters", None))
        .find(|(status, _, _)| *status == 429)
        .expect("30 requests at once exceed a burst of 5");
    let (_, headers, body) = limited;
    assert_eq!(body["error"]["kind"], "rate_limited", "{body}");
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=5).contains(&retry), "{retry}");
    assert_eq!(body["error"]["retry_after_seconds"], retry);
    let (status, _, _) = api.send(&calm, reqwest::Method::GET, "/api/v1/clusters", None);
    assert_eq!(status, 200, "another token has its own budget");
    // Probes are not a caller's work.
    assert_eq!(api.hypd.get("/healthz").status().as_u16(), 200);
}

#[test]
fn last_use_of_a_token_is_recorded() {
    let api = Api::start();
    let viewer = api.create_token("reader", "viewer");
    let (_, before) = api.get("/api/v1/tokens");
    let reader = |list: &Value| {
        list["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == "reader")
            .unwrap()["last_used_at"]
            .clone()
    };
    assert_eq!(reader(&before), Value::Null);
    assert_eq!(api.get_as(&viewer, "/api/v1/whoami").0, 200);
    let (_, after) = api.get("/api/v1/tokens");
    assert!(reader(&after).is_string(), "{after}");
    let admin = after["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "admin")
        .unwrap();
    assert!(admin["last_used_at"].is_string(), "{admin}");
}

/// Without a token `/readyz` says only whether hypd is ready; with one, as whom it acts.
#[test]
fn readiness_details_need_a_token() {
    let api = Api::start();
    let r = api.hypd.ready(true);
    assert_eq!(r.status().as_u16(), 200);
    let anonymous: Value = r.json().unwrap();
    assert_eq!(anonymous, json!({"ready": true}));
    let (status, full) = api.get("/readyz");
    assert_eq!(status, 200);
    assert_eq!(full["aws"]["account"], "123456789012", "{full}");
    assert!(full["aws"]["arn"].is_string());
}

/// The session cookie is `Secure` when the request reached a proxy over HTTPS.
#[test]
fn session_cookies_are_secure_behind_https() {
    let api = Api::start();
    let login = |forwarded: Option<&str>| {
        let mut req = api
            .http
            .post(format!("{}/auth/login", api.hypd.url))
            .json(&json!({"token": api.token}));
        if let Some(proto) = forwarded {
            req = req.header("x-forwarded-proto", proto);
        }
        let r = req.send().unwrap();
        assert_eq!(r.status().as_u16(), 200);
        r.headers()["set-cookie"].to_str().unwrap().to_owned()
    };
    assert!(login(Some("https")).ends_with("; Secure"));
    assert!(!login(None).contains("Secure"));
    assert!(!login(Some("http")).contains("Secure"));
}

/// On a loopback bind only loopback names (any port) and configured ones are served, so
/// a DNS-rebinding page cannot read hypd.
#[test]
fn only_loopback_and_configured_hosts_are_served() {
    let api = Api::start_with(&[("HYPD_ALLOWED_HOSTS", "hypd.internal")]);
    let at = crate::common::authority(&api.hypd.url);
    let get = |host: &str| {
        crate::common::raw_request(
            &at,
            &format!(
                "GET /api/v1/openapi.json HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
            ),
        )
    };
    for host in [
        "localhost:3099",
        "127.0.0.1",
        "[::1]:8080",
        "LOCALHOST",
        "hypd.internal:443",
    ] {
        assert_eq!(get(host).status, 200, "{host}");
    }
    for host in [
        "evil.example",
        "evil.example:3099",
        "127.0.0.1.nip.io",
        "localhost.evil.example",
    ] {
        let r = get(host);
        assert_eq!(r.status, 403, "{host}");
        let body = r.json();
        assert_eq!(body["error"]["kind"], "forbidden");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("HYPD_ALLOWED_HOSTS"),
            "{body}"
        );
    }
}

/// The not-found page is rendered with the caller's session like every other page: it
/// names who is signed in instead of offering "Sign in".
#[test]
fn the_not_found_page_keeps_the_session() {
    let api = Api::start();
    let page = |token: Option<&str>| {
        let mut r = api.http.get(format!("{}/no-such-page", api.hypd.url));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        let r = r.send().unwrap();
        (r.status().as_u16(), r.text().unwrap())
    };
    let (status, signed_in) = page(Some(&api.token));
    assert_eq!(status, 404);
    assert!(signed_in.contains("Not found"), "{signed_in}");
    assert!(signed_in.contains(r#"class="user-name""#), "{signed_in}");
    assert!(
        !signed_in.contains(r#"href="/login">Sign in"#),
        "{signed_in}"
    );
    let (status, anonymous) = page(None);
    assert_eq!(status, 404);
    assert!(!anonymous.contains(r#"class="user-name""#), "{anonymous}");
}

/// A destructive command runs only with the confirmation its first call returned: bound
/// to the caller, the command and the exact request, single use, five minutes. Every
/// other confirmation is refused naming `confirmation`, and nothing is revoked.
#[test]
fn destructive_commands_run_only_with_their_confirmation() {
    let api = Api::start();
    let token = |name: &str| {
        let (status, body) = api.post("/api/v1/tokens", json!({"name": name, "role": "admin"}));
        assert_eq!(status, 200, "{body}");
        body["token"].as_str().unwrap().to_owned()
    };
    let other_admin = token("second-admin");
    token("victim");
    token("bystander");
    let revoke = |as_token: &str, name: &str, body: Value| {
        api.hypd.call(
            as_token,
            reqwest::Method::DELETE,
            &format!("/api/v1/tokens/{name}"),
            Some(body),
        )
    };
    let active = |name: &str| {
        let (_, list) = api.get("/api/v1/tokens");
        list["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == name && t["revoked_at"].is_null())
    };
    let refused = |(status, body): (u16, Value), why: &str| {
        assert_eq!(status, 422, "{body}");
        assert_eq!(
            body["error"]["errors"][0]["field"], "confirmation",
            "{body}"
        );
        let message = body["error"]["errors"][0]["message"].as_str().unwrap();
        assert!(message.contains(why), "{message}");
    };

    // A dry run and a first call change nothing; the first call answers with the plan.
    let (status, dry) = revoke(&api.token, "victim", json!({"dry_run": true}));
    assert_eq!(status, 200, "{dry}");
    assert_eq!(dry["plan"]["stages"][0]["changes"][0]["kind"], "hypd:Token");
    assert!(dry.get("confirmation").is_none());
    let (status, first) = revoke(&api.token, "victim", json!({}));
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["plan"]["target"], "token/victim");
    assert_eq!(first["plan"]["stages"][0]["changes"][0]["action"], "delete");
    let confirmation = first["confirmation"].as_str().unwrap().to_owned();
    assert!(confirmation.starts_with("hypd_confirm_"));
    assert!(active("victim"), "nothing was revoked yet");

    // Wrong ones, each refused with why; the right one still works afterwards.
    let made_up = format!("hypd_confirm_{}", "0".repeat(64));
    refused(
        revoke(&api.token, "victim", json!({"confirmation": made_up})),
        "is not one hypd issued",
    );
    refused(
        revoke(&api.token, "victim", json!({"confirmation": "nope"})),
        "the value a first call without one returned",
    );
    refused(
        revoke(
            &other_admin,
            "victim",
            json!({"confirmation": confirmation}),
        ),
        "another caller",
    );
    refused(
        revoke(
            &api.token,
            "bystander",
            json!({"confirmation": confirmation}),
        ),
        "another request",
    );
    assert!(active("victim") && active("bystander"));

    let (status, done) = revoke(&api.token, "victim", json!({"confirmation": confirmation}));
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["name"], "victim");
    assert!(done["revoked_at"].is_string());
    assert!(!active("victim"));
    // Replaying the confirmed call answers the same; using it for anything else is refused.
    let (status, again) = revoke(&api.token, "victim", json!({"confirmation": confirmation}));
    assert_eq!((status, &again), (200, &done));
    refused(
        revoke(
            &api.token,
            "bystander",
            json!({"confirmation": confirmation}),
        ),
        "another request",
    );

    // An expired confirmation is refused (its expiry moved into the past in the store).
    let (_, second) = revoke(&api.token, "bystander", json!({}));
    let late = second["confirmation"].as_str().unwrap().to_owned();
    let changed = api
        .hypd
        .sql("UPDATE confirmations SET expires_at = '2000-01-01T00:00:00.000Z'");
    assert_eq!(changed, 2, "both confirmations are in the store");
    refused(
        revoke(&api.token, "bystander", json!({"confirmation": late})),
        "expired",
    );
    assert!(active("bystander"));

    // A confirmed call that fails gives its confirmation back: once what failed is put
    // right (here the token, renamed away in the store, renamed back), the same one runs.
    token("moved");
    let (_, plan) = revoke(&api.token, "moved", json!({}));
    let confirmation = plan["confirmation"].as_str().unwrap().to_owned();
    let rename = |from: &str, to: &str| {
        api.hypd.sql(&format!(
            "UPDATE api_tokens SET name = '{to}' WHERE name = '{from}'"
        ))
    };
    assert_eq!(rename("moved", "moved-away"), 1);
    let (status, failed) = revoke(&api.token, "moved", json!({"confirmation": confirmation}));
    assert_eq!(status, 404, "{failed}");
    assert_eq!(rename("moved-away", "moved"), 1);
    let (status, done) = revoke(&api.token, "moved", json!({"confirmation": confirmation}));
    assert_eq!(status, 200, "{done}");
    assert!(!active("moved"));
}
