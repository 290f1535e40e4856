//! REST against a real `hypd` and moto: the first admin token, inspection answers built
//! from EC2, stored reads, long-polling an operation, and token roles.

mod common;

use std::time::{Duration, Instant};

use common::{Hypd, Moto};
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
        let (hypd, token, moto) = common::hypd_with_moto();
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
        let db = self.hypd.data_dir.path().join("hypd.db");
        let status = std::process::Command::new("python3")
            .args([
                "-c",
                "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); \
                 c.execute(\"INSERT INTO operations (id, command, target, state, created_at, updated_at) VALUES (?, 'create_cluster', 'cluster/ml-1', ?, '2026-01-01T00:00:00.000Z', '2026-01-01T00:00:00.000Z')\", (sys.argv[2], sys.argv[3])); c.commit()",
            ])
            .arg(&db)
            .args([id, state])
            .status()
            .unwrap();
        assert!(status.success());
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
    assert_eq!(zones["freshness"]["cached"], false);
    let (_, again) = api.get("/api/v1/availability-zones");
    assert_eq!(again["freshness"]["cached"], true);
    let (_, fresh) = api.get("/api/v1/availability-zones?refresh=true");
    assert_eq!(fresh["freshness"]["cached"], false);

    let (_, other) = api.get("/api/v1/availability-zones?region=eu-west-1");
    assert_eq!(other["region"], "eu-west-1");
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

    let r = api
        .http
        .delete(format!("{}/api/v1/tokens/agent", api.hypd.url))
        .bearer_auth(&api.token)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
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
        let mut cmd = common::hypd_command(dir.path());
        cmd.args(["serve"]).envs(env.iter().copied());
        let out = run_until_listening(cmd);
        assert!(out.contains("admin token hypd_"), "{out}");
        std::fs::read_to_string(dir.path().join("admin-token")).unwrap()
    };
    let mut cmd = common::hypd_command(dir.path());
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
