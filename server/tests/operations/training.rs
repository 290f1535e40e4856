//! Training jobs through REST against moto + hypd-sim: the pre-flight's verdicts (the
//! operator off, the script missing, too many processes, elastic on spot), a dry run
//! showing the object as applied, a PyTorch job whose pods run on the group's nodes with
//! its GPUs, EFA and the shared bucket at /s3, failures spending the recovery budget as
//! the ledger shows, the budget running out failing the job with the reason, and the
//! job deleted with its pods; ms-swift, VERL (a RayJob of a head and workers) and
//! custom jobs, and a job's metrics read back from the real MLflow server behind the
//! sim's tracking server.

use base64::Engine;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use reqwest::Method;
use serde_json::{Value, json};

use crate::FAST;
use crate::common::Hypd;
use crate::common::cluster::{kube_client, small, world_with_cluster};
use crate::inference::run_op;

/// Puts `key` in the shared bucket through hypd, as a user would from the Storage tab.
pub fn upload(hypd: &Hypd, token: &str, name: &str, key: &str) {
    let (status, put) = hypd.call(
        token,
        Method::POST,
        &format!("/api/v1/clusters/{name}/storage/shared-s3/files"),
        Some(json!({"key": key, "content_base64":
            base64::engine::general_purpose::STANDARD.encode("import torch\nprint('step 1 loss=2.5')\n")})),
    );
    assert_eq!(status, 200, "{put}");
}

/// Turns the training operator on.
pub fn operator_on(hypd: &Hypd, token: &str, name: &str) {
    let (status, started) = hypd.call(
        token,
        Method::POST,
        &format!("/api/v1/clusters/{name}/features"),
        Some(json!({"training_operator": true})),
    );
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
}

fn verdicts(checks: &Value) -> Vec<(String, bool)> {
    checks["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["check"].as_str().unwrap().to_owned(),
                v["passed"].as_bool().unwrap(),
            )
        })
        .collect()
}

fn failed(checks: &Value) -> Vec<String> {
    verdicts(checks)
        .into_iter()
        .filter(|(_, ok)| !ok)
        .map(|(c, _)| c)
        .collect()
}

async fn annotate(world: &crate::common::World, name: &str, job: &str, annotations: Value) {
    let client = kube_client(world, name).await;
    let gvk = GroupVersionKind::gvk("sagemaker.amazonaws.com", "v1", "HyperPodPyTorchJob");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "hyperpodpytorchjobs");
    let jobs: Api<DynamicObject> = Api::namespaced_with(client, "default", &ar);
    jobs.patch(
        job,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
    )
    .await
    .unwrap();
}

fn get_job(hypd: &Hypd, token: &str, name: &str, job: &str) -> Value {
    let (status, got) = hypd.call(
        token,
        Method::GET,
        &format!("/api/v1/clusters/{name}/training-jobs/{job}"),
        None,
    );
    assert_eq!(status, 200, "{got}");
    got
}

fn diagnosis(hypd: &Hypd, token: &str, name: &str, job: &str) -> Value {
    let (status, found) = hypd.call(
        token,
        Method::GET,
        &format!("/api/v1/clusters/{name}/training-jobs/{job}/diagnosis"),
        None,
    );
    assert_eq!(status, 200, "{found}");
    found
}

fn wait_for_job(
    hypd: &Hypd,
    token: &str,
    name: &str,
    job: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let got = get_job(hypd, token, name, job);
        if done(&got) {
            return got;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: {got:#}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

#[test]
fn a_training_job_runs_spends_its_budget_as_the_ledger_shows_and_is_deleted() {
    let name = "ml-train";
    let (world, hypd, token, _) = world_with_cluster(FAST, json!({}), small(name));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let jobs = format!("/api/v1/clusters/{name}/training-jobs");
    let body = json!({"job": "sft", "nodes": 2,
        "recipe": {"kind": "pytorch", "script": "/s3/scripts/train.py", "args": ["--epochs", "1"]},
        "recovery": {"job_max_retry_count": 3, "restarts_before_full_job_restart": 5},
        "log_monitoring": [{"name": "hang", "pattern": "step \\d+: loss=", "expected_frequency_seconds": 120}]});

    // Nothing is ready: the operator is off and the script not uploaded; both say so, by
    // field, in the check and in the refusal alike.
    let (status, checks) = hypd.call(
        &token,
        Method::POST,
        &format!("{jobs}/check"),
        Some(body.clone()),
    );
    assert_eq!(status, 200, "{checks}");
    assert_eq!(checks["ready"], false);
    assert_eq!(failed(&checks), ["feature", "file"], "{checks:#}");
    // Reading a job names the feature too, rather than "not found".
    let (status, missing) = hypd.call(&token, Method::GET, &format!("{jobs}/sft"), None);
    assert_eq!(status, 422, "{missing}");
    assert!(missing.to_string().contains("update_features"), "{missing}");
    let (status, refused) = hypd.call(&token, Method::POST, &jobs, Some(body.clone()));
    assert_eq!(status, 422, "{refused}");
    let fields: Vec<&str> = refused["error"]["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["name", "recipe.script"], "{refused:#}");
    assert!(refused.to_string().contains("update_features"), "{refused}");

    operator_on(&hypd, &token, name);
    upload(&hypd, &token, name, "scripts/train.py");

    // More processes than the type has GPUs, and elastic below the nodes asked for.
    let mut too_many = body.clone();
    too_many["processes_per_node"] = json!(4);
    let (_, checks) = hypd.call(
        &token,
        Method::POST,
        &format!("{jobs}/check"),
        Some(too_many),
    );
    assert_eq!(failed(&checks), ["gpus"], "{checks:#}");
    let mut elastic = body.clone();
    elastic["elastic"] = json!({"min_nodes": 3, "max_nodes": 4});
    let (status, refused) = hypd.call(&token, Method::POST, &jobs, Some(elastic));
    assert_eq!(
        (status, &refused["error"]["errors"][0]["field"]),
        (422, &json!("nodes")),
        "{refused}"
    );

    let (status, checks) = hypd.call(
        &token,
        Method::POST,
        &format!("{jobs}/check"),
        Some(body.clone()),
    );
    assert_eq!(status, 200, "{checks}");
    assert_eq!(checks["ready"], true, "{checks:#}");

    // The dry run shows the object's spec as it will be applied.
    let mut dry = body.clone();
    dry["dry_run"] = json!(true);
    let (status, plan) = hypd.call(&token, Method::POST, &jobs, Some(dry));
    assert_eq!(status, 200, "{plan}");
    let change = &plan["plan"]["stages"][0]["changes"][0];
    assert_eq!(
        change["kind"], "k8s:sagemaker.amazonaws.com/v1/HyperPodPyTorchJob",
        "{plan:#}"
    );
    let spec = &change["fields"][0]["new"];
    let container = &spec["replicaSpecs"][0]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["resources"]["requests"],
        json!({"nvidia.com/gpu": "1", "vpc.amazonaws.com/efa": "1"})
    );
    assert_eq!(spec["runPolicy"]["jobMaxRetryCount"], 3);

    let (status, started) = hypd.call(&token, Method::POST, &jobs, Some(body.clone()));
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(&token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    assert_eq!(
        (&op["outputs"]["running"], &op["outputs"]["instance_group"]),
        (&json!(2), &json!("gpu")),
        "{op:#}"
    );

    // kubectl's view: the pods run on the group's two nodes, one each, with the bucket at
    // /s3 and the GPUs and EFA of the type.
    let pods: Vec<Pod> = rt.block_on(async {
        let client = kube_client(&world, name).await;
        Api::<Pod>::namespaced(client, "default")
            .list(&ListParams::default().labels("hypd.dev/training-job=sft"))
            .await
            .unwrap()
            .items
    });
    assert_eq!(pods.len(), 2);
    let nodes: std::collections::BTreeSet<String> = pods
        .iter()
        .map(|p| p.spec.as_ref().unwrap().node_name.clone().unwrap())
        .collect();
    assert_eq!(nodes.len(), 2, "one pod per node");
    let pod = serde_json::to_value(&pods[0]).unwrap();
    assert_eq!(
        pod["spec"]["containers"][0]["volumeMounts"][0]["mountPath"],
        "/s3"
    );
    assert_eq!(
        pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
        "shared-s3"
    );

    let (status, listed) = hypd.call(&token, Method::GET, &jobs, None);
    assert_eq!(status, 200, "{listed}");
    assert_eq!(
        (
            &listed["jobs"][0]["job"],
            &listed["jobs"][0]["recipe"],
            &listed["jobs"][0]["phase"]
        ),
        (&json!("sft"), &json!("pytorch"), &json!("running")),
        "{listed:#}"
    );

    // Two failures: two units of the budget, each with its pod, node and exit code.
    rt.block_on(annotate(
        &world,
        name,
        "sft",
        json!({"sim.hypd.dev/exit-code": "3", "sim.hypd.dev/failures": "2"}),
    ));
    let got = wait_for_job(
        &hypd,
        &token,
        name,
        "sft",
        "two restarts, then running",
        |j| j["recovery"]["restarts_used"] == 2 && j["phase"] == "running",
    );
    let ledger = &got["recovery"];
    assert_eq!(
        (&ledger["restarts_left"], &got["attempt"]),
        (&json!(1), &json!(3)),
        "{got:#}"
    );
    let entries = ledger["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "{got:#}");
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(
            (&e["action"], &e["exit_code"], &e["attempt"]),
            (&json!("pod_restart"), &json!(3), &json!(i + 1)),
            "{e}"
        );
        assert!(nodes.contains(e["node"].as_str().unwrap()), "{e}");
    }
    assert!(
        ledger["next_failure"]
            .as_str()
            .unwrap()
            .starts_with("the failed pod restarts (restart 3 of 3)"),
        "{got:#}"
    );
    assert!(
        got["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["reason"] == "PodRestart"),
        "{got:#}"
    );

    // A hang: pod 0 stops printing; the log rule fires and restarts it, as the ledger says.
    rt.block_on(async {
        let client = kube_client(&world, name).await;
        Api::<Pod>::namespaced(client, "default")
            .patch(
                "sft-pod-0",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"sim.hypd.dev/hang-after-seconds": "1"}}}),
                ),
            )
            .await
            .unwrap();
    });
    let got = wait_for_job(&hypd, &token, name, "sft", "the hang restarted", |j| {
        j["recovery"]["restarts_used"] == 3
    });
    let hang = &got["recovery"]["entries"][2];
    assert_eq!(
        (&hang["log_rule"], &hang["pod"], &hang["exit_code"]),
        (&json!("hang"), &json!("sft-pod-0"), &Value::Null),
        "{got:#}"
    );
    assert!(
        hang["message"].as_str().unwrap().contains("a hang"),
        "{got:#}"
    );
    assert!(
        got["recovery"]["next_failure"]
            .as_str()
            .unwrap()
            .starts_with("the job fails"),
        "{got:#}"
    );

    // Failing for good: pod 1's collective hangs, NCCL's watchdog (the job's process
    // group times out after 30 s, before its hang rule's 120 s) takes the process down
    // (exit 134) and the job fails with the reason; its pods stay, logs and all.
    let before = diagnosis(&hypd, &token, name, "sft");
    assert!(
        before["suggestions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["command"] == "diagnose_node"),
        "the nodes of its restarts only: {before:#}"
    );
    rt.block_on(async {
        let client = kube_client(&world, name).await;
        Api::<Pod>::namespaced(client, "default")
            .patch(
                "sft-pod-1",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {
                    "sim.hypd.dev/nccl-timeout-after-seconds": "1",
                    "sim.hypd.dev/nccl-timeout-seconds": "30",
                }}})),
            )
            .await
            .unwrap();
    });
    let got = wait_for_job(&hypd, &token, name, "sft", "the budget spent", |j| {
        j["phase"] == "failed"
    });
    // What ails it, read only: the watchdog's line with its pod, node, place and time,
    // the abort's exit code; the next reads are the node's diagnosis and the log.
    let unchanged = || {
        let mut job = get_job(&hypd, &token, name, "sft");
        job["fetched_at"] = Value::Null;
        job
    };
    let before = unchanged();
    let found = diagnosis(&hypd, &token, name, "sft");
    assert_eq!(unchanged(), before, "a diagnosis changed the job");
    let timed_out = found["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| {
            f["summary"]
                .as_str()
                .unwrap()
                .starts_with("an NCCL collective timed out in pod sft-pod-1 on i-")
        })
        .unwrap_or_else(|| panic!("{found:#}"));
    assert_eq!(timed_out["severity"], "error");
    assert!(
        timed_out["evidence"]
            .as_str()
            .unwrap()
            .contains("[Rank 1] Watchdog caught collective operation timeout"),
        "{timed_out}"
    );
    assert!(
        found
            .to_string()
            .contains("pod sft-pod-1 exited with code 134: SIGABRT"),
        "{found:#}"
    );
    // First the node under the rank that timed out, last the log before it; only reads.
    let suggestions = found["suggestions"].as_array().unwrap();
    let on = pods
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some("sft-pod-1"))
        .and_then(|p| p.spec.as_ref()?.node_name.clone())
        .unwrap();
    assert_eq!(
        (
            &suggestions[0]["command"],
            &suggestions[0]["arguments"]["node_id"]
        ),
        (
            &json!("diagnose_node"),
            &json!(on.trim_start_matches("hyperpod-"))
        ),
        "{found:#}"
    );
    let last = suggestions.last().unwrap();
    assert_eq!(
        (&last["command"], &last["arguments"]["pod"]),
        (&json!("get_training_job_logs"), &json!("sft-pod-1")),
        "{found:#}"
    );
    assert!(
        suggestions.iter().all(|s| s["effect"] == "read_only"),
        "{found:#}"
    );
    let failed_with = got["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["kind"] == "Failed")
        .unwrap();
    assert_eq!(failed_with["reason"], "RetryLimitExceeded", "{got:#}");
    assert_eq!(got["recovery"]["restarts_left"], 0, "{got:#}");
    assert_eq!(
        got["recovery"]["entries"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()["action"],
        "failed"
    );

    // The operator cannot be turned off under a job: its CRD would take the job along.
    let (status, kept) = hypd.call(
        &token,
        Method::POST,
        &format!("/api/v1/clusters/{name}/features"),
        Some(json!({"training_operator": false})),
    );
    assert_eq!(
        (status, &kept["error"]["errors"][0]["field"]),
        (422, &json!("training_operator")),
        "{kept}"
    );
    assert!(kept.to_string().contains("default/sft"), "{kept}");

    // The name is taken until the job is deleted; deleting it takes its pods.
    let (status, taken) = hypd.call(&token, Method::POST, &jobs, Some(body.clone()));
    assert_eq!(
        (status, &taken["error"]["errors"][0]["field"]),
        (422, &json!("job")),
        "{taken}"
    );
    let (status, deleting) = hypd.confirmed(&token, Method::DELETE, &format!("{jobs}/sft"), None);
    assert_eq!(status, 200, "{deleting}");
    let op = hypd.finish(&token, deleting["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");
    let (status, listed) = hypd.call(&token, Method::GET, &jobs, None);
    assert_eq!(
        (status, listed["jobs"].as_array().unwrap().len()),
        (200, 0),
        "{listed}"
    );
    let (status, gone) = hypd.call(
        &token,
        Method::DELETE,
        &format!("{jobs}/sft"),
        Some(json!({})),
    );
    assert_eq!(
        (status, &gone["error"]["errors"][0]["field"]),
        (422, &json!("job")),
        "{gone}"
    );
}

/// A WebSocket upgrade to a job's log stream, with `token`.
fn log_request(
    hypd: &Hypd,
    token: &str,
    name: &str,
    job: &str,
    query: &str,
) -> tokio_tungstenite::tungstenite::handshake::client::Request {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = format!(
        "{}/api/v1/clusters/{name}/training-jobs/{job}/logs/stream?{query}",
        hypd.url.replace("http://", "ws://")
    );
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

/// The next JSON frame, or the close frame's code.
async fn frame<S>(ws: &mut S) -> Result<Value, u16>
where
    S: futures_util::Stream<
            Item = Result<
                tokio_tungstenite::tungstenite::Message,
                tokio_tungstenite::tungstenite::Error,
            >,
        > + Unpin,
{
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    loop {
        let msg = tokio::time::timeout(std::time::Duration::from_secs(30), ws.next())
            .await
            .expect("a frame within 30 s");
        match msg {
            Some(Ok(Message::Text(t))) => return Ok(serde_json::from_str(&t).unwrap()),
            Some(Ok(Message::Close(c))) => return Err(c.map_or(1005, |c| u16::from(c.code))),
            Some(Ok(_)) => {}
            other => panic!("the stream broke: {other:?}"),
        }
    }
}

fn open_streams(hypd: &Hypd) -> f64 {
    let body = reqwest::blocking::get(format!("{}/metrics", hypd.url))
        .unwrap()
        .text()
        .unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix("hypd_log_streams_open "))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

#[test]
fn twenty_viewers_share_one_log_stream_and_one_that_stops_reading_is_cut_off() {
    let name = "ml-logs";
    let (world, hypd, token, _) = world_with_cluster(FAST, json!({}), small(name));
    operator_on(&hypd, &token, name);
    upload(&hypd, &token, name, "scripts/train.py");
    let jobs = format!("/api/v1/clusters/{name}/training-jobs");
    let (status, started) = hypd.call(
        &token,
        Method::POST,
        &jobs,
        Some(
            json!({"job": "logs", "recipe": {"kind": "pytorch", "script": "/s3/scripts/train.py"}}),
        ),
    );
    assert_eq!(status, 200, "{started}");
    let op = hypd.finish(&token, started["operation_id"].as_str().unwrap());
    assert_eq!(op["state"], "succeeded", "{op:#}");

    // REST and MCP read the tail; a pod that is not the job's is refused by field.
    let (status, tail) = hypd.call(
        &token,
        Method::GET,
        &format!("{jobs}/logs/logs?tail_lines=5"),
        None,
    );
    assert_eq!(status, 200, "{tail}");
    assert_eq!(tail["pod"], "logs-pod-0", "{tail}");
    let lines = tail["lines"].as_array().unwrap();
    assert!(!lines.is_empty() && lines.len() <= 5, "{tail}");
    assert!(lines[0].as_str().unwrap().contains("loss="), "{tail}");
    let (status, refused) = hypd.call(
        &token,
        Method::GET,
        &format!("{jobs}/logs/logs?pod=other-pod"),
        None,
    );
    assert_eq!(
        (status, &refused["error"]["errors"][0]["field"]),
        (422, &json!("pod")),
        "{refused}"
    );

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use futures_util::StreamExt;
        // Four lines a simulated second: some 2,400 a second at the test's clock.
        let client = kube_client(&world, name).await;
        Api::<Pod>::namespaced(client, "default")
            .patch(
                "logs-pod-0",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"sim.hypd.dev/log-interval-seconds": "0.25"}}})),
            )
            .await
            .unwrap();
        // One that stops reading after its hello: its receive window is small, so hypd's
        // writes to it back up as soon as it stops.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let addr: std::net::SocketAddr = hypd.url.trim_start_matches("http://").parse().unwrap();
        let tcp = socket.connect(addr).await.unwrap();
        let (mut slow, _) = tokio_tungstenite::client_async(log_request(&hypd, &token, name, "logs", "tail_lines=0"), tcp)
            .await
            .unwrap();
        assert_eq!(frame(&mut slow).await.unwrap()["type"], "hello");

        let mut viewers = Vec::new();
        for _ in 0..20 {
            let (ws, _) = tokio_tungstenite::connect_async(log_request(&hypd, &token, name, "logs", "tail_lines=50"))
                .await
                .unwrap();
            viewers.push(ws);
        }
        // Each reads on until it has seen 12,000 lines past the first: lines numbered
        // without a gap, the same text for the same number in every viewer.
        let reads = viewers.into_iter().map(|mut ws| {
            tokio::spawn(async move {
                let hello = frame(&mut ws).await.unwrap();
                assert_eq!((&hello["type"], &hello["pod"]), (&json!("hello"), &json!("logs-pod-0")));
                let mut seen: Vec<(u64, String)> = Vec::new();
                while seen.len() < 12_000 {
                    let f = frame(&mut ws).await.unwrap_or_else(|code| panic!("closed with {code} after {} lines", seen.len()));
                    assert_eq!(f["type"], "lines", "{f}");
                    for l in f["lines"].as_array().unwrap() {
                        seen.push((l["seq"].as_u64().unwrap(), l["text"].as_str().unwrap().to_owned()));
                    }
                }
                for pair in seen.windows(2) {
                    assert_eq!(pair[1].0, pair[0].0 + 1, "lines in order, none skipped");
                }
                ws.close(None).await.ok();
                seen
            })
        });
        let all: Vec<Vec<(u64, String)>> = futures_util::future::join_all(reads)
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        let by_seq: std::collections::HashMap<u64, &str> =
            all[0].iter().map(|(s, t)| (*s, t.as_str())).collect();
        for seen in &all[1..] {
            for (seq, text) in seen {
                if let Some(first) = by_seq.get(seq) {
                    assert_eq!(first, text, "line {seq} differs between viewers");
                }
            }
        }
        // Lines come faster (as a chatty job's do), and one viewer reads 100,000 of them
        // while the slow one still reads nothing: far more than hypd's channel and the
        // sockets between them hold. Should this busy machine stall the fast one a whole
        // channel behind, hypd cuts it off as it would any viewer, and it reconnects after
        // its last line as the console does: each line then comes once, in order, or is
        // counted in the new hello's `missed`.
        let client = kube_client(&world, name).await;
        Api::<Pod>::namespaced(client, "default")
            .patch(
                "logs-pod-0",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"sim.hypd.dev/log-interval-seconds": "0.02"}}})),
            )
            .await
            .unwrap();
        let mut query = "tail_lines=0".to_owned();
        let mut kept_up = 0;
        let mut reconnects = 0;
        let mut next: Option<u64> = None;
        'viewer: while kept_up < 100_000 {
            let (mut fast, _) = tokio_tungstenite::connect_async(log_request(&hypd, &token, name, "logs", &query))
                .await
                .unwrap();
            let hello = frame(&mut fast).await.unwrap();
            assert_eq!(hello["type"], "hello", "{hello}");
            next = next.map(|n| n + hello["missed"].as_u64().unwrap());
            loop {
                match frame(&mut fast).await {
                    Ok(f) if f["type"] == "lines" => {
                        for l in f["lines"].as_array().unwrap() {
                            let seq = l["seq"].as_u64().unwrap();
                            assert_eq!(seq, *next.get_or_insert(seq), "lines in order, none skipped");
                            next = Some(seq + 1);
                            kept_up += 1;
                        }
                        if kept_up >= 100_000 {
                            fast.close(None).await.ok();
                            break 'viewer;
                        }
                    }
                    Ok(f) if f["type"] == "missed" => {
                        // `after` is the last line this connection sent, if it sent any.
                        if let Some(after) = f["after"].as_u64() {
                            assert_eq!(Some(after + 1), next, "{f}");
                        }
                    }
                    Err(4409) => {
                        reconnects += 1;
                        assert!(reconnects <= 20, "the fast viewer was cut off {reconnects} times");
                        if let Some(n) = next {
                            query = format!("after={}", n - 1);
                        }
                        continue 'viewer;
                    }
                    other => panic!("the fast viewer got {other:?} after {kept_up} lines"),
                }
            }
        }
        // The slow one reads again: what was buffered for it, then how many it missed,
        // and the close.
        let mut last = None;
        let mut read = 0;
        let missed = loop {
            assert!(read < 1_000_000, "read {read} lines and was never told it missed some");
            match frame(&mut slow).await {
                Ok(f) if f["type"] == "lines" => {
                    let lines = f["lines"].as_array().unwrap();
                    read += lines.len();
                    last = lines.last().map(|l| l["seq"].clone());
                }
                Ok(f) if f["type"] == "missed" => break f,
                Ok(f) => panic!("{f}"),
                Err(code) => panic!("closed with {code} before a missed notice"),
            }
        };
        assert!(missed["lines"].as_u64().unwrap() > 0, "{missed}");
        assert_eq!(missed["after"], last.unwrap_or(Value::Null), "{missed}");
        assert_eq!(frame(&mut slow).await, Err(4409));
        let _ = slow.next().await;
    });
    // All of them were one upstream stream (it lingers a while for reconnects).
    assert_eq!(open_streams(&hypd), 1.0);
    drop(world);
}

#[test]
fn ms_swift_verl_and_custom_jobs_run_and_report_metrics_to_mlflow() {
    let name = "ml-recipes";
    let (world, hypd, token, _) = world_with_cluster(FAST, json!({}), small(name));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let jobs = format!("/api/v1/clusters/{name}/training-jobs");
    operator_on(&hypd, &token, name);
    upload(&hypd, &token, name, "configs/swift.yaml");

    // A verl job needs KubeRay: the check names the feature to turn on.
    let verl = json!({"job": "rl", "nodes": 2, "recipe": {"kind": "verl",
        "args": ["data.train_files=/s3/data/train.parquet"]}});
    let (_, checks) = hypd.call(
        &token,
        Method::POST,
        &format!("{jobs}/check"),
        Some(verl.clone()),
    );
    assert_eq!(failed(&checks), ["feature"], "{checks:#}");
    assert!(
        checks.to_string().contains("kuberay_operator: true"),
        "{checks}"
    );
    // A name of a tracking server that does not exist is refused by its field.
    let mut unknown = json!({"job": "sw", "mlflow_tracking_server": "nope",
        "recipe": {"kind": "ms_swift", "command": "sft", "config": "/s3/configs/swift.yaml"}});
    let (status, refused) = hypd.call(&token, Method::POST, &jobs, Some(unknown.clone()));
    assert_eq!(status, 422, "{refused}");
    assert_eq!(
        refused["error"]["errors"][0]["field"],
        "mlflow_tracking_server"
    );

    run_op(
        &hypd,
        &token,
        &format!("/api/v1/clusters/{name}/features"),
        json!({"kuberay_operator": true}),
    );
    let op = run_op(
        &hypd,
        &token,
        &format!("/api/v1/clusters/{name}/mlflow"),
        json!({}),
    );
    assert_eq!(op["outputs"]["status"], "Created", "{op:#}");

    // LLaMA-Factory through REST too: planned with its launcher, the config and the
    // switch that makes it report to MLflow.
    let (status, plan) = hypd.call(
        &token,
        Method::POST,
        &jobs,
        Some(json!({"job": "lf", "dry_run": true,
            "recipe": {"kind": "llama_factory", "config": "/s3/configs/swift.yaml"}})),
    );
    assert_eq!(status, 200, "{plan}");
    let spec = &plan["plan"]["stages"][0]["changes"][0]["fields"][0]["new"];
    let command = &spec["replicaSpecs"][0]["template"]["spec"]["containers"][0]["command"];
    assert_eq!(
        command.as_array().unwrap()[4..],
        [json!("/s3/configs/swift.yaml"), json!("report_to=mlflow")],
        "{plan:#}"
    );

    // ms-swift: a HyperPodPyTorchJob reporting to the cluster's tracking server.
    unknown
        .as_object_mut()
        .unwrap()
        .remove("mlflow_tracking_server");
    let op = run_op(&hypd, &token, &jobs, unknown);
    assert!(
        op["outputs"]["tracking_server"]
            .as_str()
            .is_some_and(|a| a.ends_with(&format!(":mlflow-tracking-server/{name}-mlflow"))),
        "{op:#}"
    );
    assert_eq!(op["outputs"]["experiment"], name);

    // Its run reports while it runs: get_training_job links it, tagged with attempt 1,
    // and the metrics are the points the pod posted to the real MLflow server.
    let got = wait_for_job(&hypd, &token, name, "sw", "a run in MLflow", |j| {
        j["mlflow"]["runs"]
            .as_array()
            .is_some_and(|r| !r.is_empty())
    });
    let run = &got["mlflow"]["runs"][0];
    assert_eq!(run["attempt"], 1, "{got:#}");
    assert!(
        got["mlflow"]["tracking_server"]
            .as_str()
            .unwrap()
            .ends_with(&format!(":mlflow-tracking-server/{name}-mlflow"))
    );
    let metrics = format!("{jobs}/sw/metrics?metrics=loss&max_points=50");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let loss = loop {
        let (status, m) = hypd.call(&token, Method::GET, &metrics, None);
        assert_eq!(status, 200, "{m}");
        let points = m["series"][0]["points"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if points.len() >= 5 {
            assert_eq!(m["series"][0]["key"], "loss");
            break points;
        }
        assert!(std::time::Instant::now() < deadline, "loss points: {m:#}");
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    assert!(loss.len() <= 50);
    let first = loss[0][1].as_f64().unwrap();
    let last = loss[loss.len() - 1][1].as_f64().unwrap();
    assert!(last < first, "loss falls: {loss:?}");

    // verl on a node freed by deleting the ms-swift job: a RayJob with a head and a
    // worker on the group's nodes, each with the node's GPU and the bucket at /s3.
    let (status, started) = hypd.confirmed(&token, Method::DELETE, &format!("{jobs}/sw"), None);
    assert_eq!(status, 200, "{started}");
    hypd.finish(&token, started["operation_id"].as_str().unwrap());
    let op = run_op(&hypd, &token, &jobs, verl);
    assert_eq!(op["outputs"]["running"], 2, "{op:#}");
    let pods: Vec<Pod> = rt.block_on(async {
        let client = kube_client(&world, name).await;
        Api::<Pod>::namespaced(client, "default")
            .list(&ListParams::default().labels("hypd.dev/training-job=rl"))
            .await
            .unwrap()
            .items
    });
    let kinds: Vec<String> = pods
        .iter()
        .map(|p| p.metadata.labels.as_ref().unwrap()["ray.io/node-type"].clone())
        .collect();
    assert_eq!(kinds, ["head", "worker"], "{pods:#?}");
    for p in &pods {
        let p = serde_json::to_value(p).unwrap();
        let c = &p["spec"]["containers"][0];
        assert_eq!(c["resources"]["limits"]["nvidia.com/gpu"], "1");
        assert_eq!(c["volumeMounts"][0]["mountPath"], "/s3");
        assert_eq!(
            p["spec"]["nodeSelector"]["sagemaker.amazonaws.com/instance-group-name"],
            "gpu"
        );
    }
    let (_, listed) = hypd.call(&token, Method::GET, &jobs, None);
    let rl = listed["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job"] == "rl")
        .unwrap();
    assert_eq!(
        (&rl["kind"], &rl["recipe"], &rl["phase"], &rl["nodes"]),
        (
            &json!("RayJob"),
            &json!("verl"),
            &json!("running"),
            &json!(2)
        ),
        "{listed:#}"
    );

    // A custom RayJob with a field its CRD does not have is refused by the cluster's own
    // schema; without it, it is applied as given.
    let mut custom = json!({"job": "mine", "recipe": {"kind": "custom", "object": {
        "apiVersion": "ray.io/v1", "kind": "RayJob",
        "spec": {"entrypoint": "python3 -c 'print(1)'", "shutdownAfterJobFinishes": false,
            "notAField": 1,
            "rayClusterSpec": {"headGroupSpec": {"rayStartParams": {}, "template": {"spec": {
                "containers": [{"name": "ray-head", "image": "rayproject/ray:2.46.0",
                    "resources": {"requests": {"cpu": "1"}}}]}}}}}}}});
    let (status, refused) = hypd.call(&token, Method::POST, &jobs, Some(custom.clone()));
    assert_eq!(status, 422, "{refused}");
    assert_eq!(
        refused["error"]["errors"][0]["field"], "recipe.object",
        "{refused:#}"
    );
    assert!(refused.to_string().contains("notAField"), "{refused}");
    custom["recipe"]["object"]["spec"]
        .as_object_mut()
        .unwrap()
        .remove("notAField");
    run_op(&hypd, &token, &jobs, custom);
    let got = get_job(&hypd, &token, name, "mine");
    assert_eq!(
        (&got["recipe"], &got["kind"]),
        (&json!("custom"), &json!("RayJob")),
        "{got:#}"
    );
}
