//! `download_model`: a Kubernetes Job in the cluster downloads the model (hypd itself
//! never touches the weights: they go from the hub to the storage through the cluster's
//! network), and the operation follows it. The Job resolves the revision to its commit,
//! finishes at once when the directory already holds that commit, downloads each file to
//! the pod's scratch disk and copies it onto the storage (Mountpoint writes files
//! sequentially and cannot rename), and writes the manifest last, so a manifest means a
//! complete model. Its output's `hypd-progress` lines are the operation's progress.
//!
//! A token never reaches hypd's store: [`Pipeline::keep_secrets`] puts it in the Secret
//! `hypd-hf-token` before the operation is stored, and the Job reads it from there.

use std::time::Duration;

use app::api::ApiError;
use app::api::models::{DownloadModel, MANIFEST, TOKEN_SECRET};
use app::api::storage::{SHARED_CLAIM, path_in_pods};
use app::api::values::IdempotencyKey;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::{ListParams, LogParams};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::cluster::storage::NAMESPACE;
use crate::operation::pipeline::{Context, Pipeline, Preflight, Progress, stages};
use crate::resources::kube::object::Applied;
use crate::resources::kube::{self as kubernetes};
use crate::resources::tags::K8S_MANAGED_BY;
use crate::resources::{converge, is_planning, planned};
use crate::storage::{bucket_of, region_of};

stages! {
    pub enum Stage {
        Job = "job", "The download Job applied: the storage mounted at its path, the token's Secret read", true;
        Download = "download", "The Job complete, its progress read from its output", true;
        Record = "record", "The manifest read: the commit the revision resolved to, the files and their sizes", true;
    }
}

/// What the stages found, stored with the operation. Field names are stored: never rename.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Outputs {
    /// The Job this operation created (`default/<name>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_in_pods: Option<String>,
    /// The last progress the Job printed, e.g. `files 3/7, 2.1 GiB of 14.9 GiB`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// How many Jobs failed before the one running: a retry starts a new Job.
    #[serde(default)]
    pub attempt: u32,
    /// The Job writes over another revision: decided once, when its first Job is made.
    #[serde(default)]
    pub replace: bool,
}

/// The image the Job runs: Python with pip, pinned.
const IMAGE: &str = "python:3.12.8-slim";
/// The hub client the Job installs, pinned.
const HUB_CLIENT: &str = "huggingface_hub==0.26.5";
const POLL: Duration = Duration::from_secs(2);

/// What the Job's container runs: resolve, skip if held, download each file to scratch
/// and copy it onto the storage, manifest last.
const PROGRAM: &str = r#"
import hashlib, json, os, shutil, sys, time
from huggingface_hub import HfApi
model, revision, dest = os.environ["HYPD_MODEL_ID"], os.environ["HYPD_MODEL_REVISION"], os.environ["HYPD_MODEL_DIR"]
replace = os.environ.get("HYPD_REPLACE") == "true"
api = HfApi(token=os.environ.get("HF_TOKEN") or None)
info = api.model_info(model, revision=revision, files_metadata=True)
commit = info.sha
manifest = os.path.join(dest, ".hypd-model.json")
if os.path.exists(manifest):
    with open(manifest) as f:
        held = json.load(f)
    if held.get("commit") == commit:
        n, b = len(held["files"]), held["size_bytes"]
        print(f"hypd-progress files={n}/{n} bytes={b}/{b} commit={commit} cached=true", flush=True)
        sys.exit(0)
    if not replace:
        print(f"hypd-error {dest} holds {held.get('revision')} ({held.get('commit')}); send replace: true to download {revision} ({commit}) over it", flush=True)
        sys.exit(3)
    os.remove(manifest)
files = [(s.rfilename, s.size or 0) for s in info.siblings]
total, done, listed = sum(s for _, s in files), 0, []
os.makedirs(dest, exist_ok=True)
for i, (name, _) in enumerate(files, 1):
    local = api.hf_hub_download(model, name, revision=commit, local_dir="/hypd-scratch")
    digest = hashlib.sha256()
    with open(local, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    target = os.path.join(dest, name)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.exists(target):
        os.remove(target)
    shutil.copyfile(local, target)
    size = os.path.getsize(local)
    os.remove(local)
    done += size
    listed.append({"path": name, "size_bytes": size, "sha256": digest.hexdigest()})
    print(f"hypd-progress files={i}/{len(files)} bytes={done}/{total} commit={commit} file={name}", flush=True)
# What the revision before held and this one does not would be loaded beside it.
keep = {os.path.normpath(os.path.join(dest, f["path"])) for f in listed}
for root, _, names in os.walk(dest):
    for n in names:
        path = os.path.normpath(os.path.join(root, n))
        if path not in keep and path != os.path.normpath(manifest):
            os.remove(path)
with open(manifest, "w") as f:
    json.dump({"model": model, "revision": revision, "commit": commit, "files": listed, "size_bytes": done,
               "downloaded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, f)
"#;

/// The Job of attempt `attempt` of operation `operation` for `model`: a readable part of
/// the model's name and a part of the operation's, so each download (and each retry of
/// a failed one) has its own, and a step run again finds it.
fn job_name(model: &str, operation: &str, attempt: u32) -> String {
    let mut slug: String = model
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    while slug.contains("--") {
        slug = slug.replace("--", "-");
    }
    let slug: String = slug.trim_matches('-').chars().take(40).collect();
    let hash = match attempt {
        0 => format!("{:x}", Sha256::digest(operation.as_bytes())),
        n => format!(
            "{:x}",
            Sha256::digest(format!("{operation}#{n}").as_bytes())
        ),
    };
    format!("hypd-model-{}-{}", slug.trim_end_matches('-'), &hash[..8])
}

/// The storage a request downloads into.
fn storage(r: &DownloadModel) -> &str {
    r.storage.as_ref().map_or(SHARED_CLAIM, |s| s.as_str())
}

/// The Job's object.
fn job(r: &DownloadModel, name: &str, mount: &str, replace: bool) -> Result<Job, ApiError> {
    let dir = path_in_pods(mount, &r.prefix());
    let mut env = vec![
        json!({ "name": "HYPD_MODEL_ID", "value": r.model.as_str() }),
        json!({ "name": "HYPD_MODEL_REVISION", "value": r.revision() }),
        json!({ "name": "HYPD_MODEL_DIR", "value": dir }),
        json!({ "name": "HYPD_REPLACE", "value": if replace { "true" } else { "false" } }),
        json!({ "name": "HYPD_PROGRAM", "value": PROGRAM }),
        json!({ "name": "HF_HUB_DISABLE_TELEMETRY", "value": "1" }),
    ];
    // A public model needs no token.
    if let Some(secret) = &r.hf_token_secret {
        env.push(json!({ "name": "HF_TOKEN", "valueFrom": { "secretKeyRef": {
            "name": secret.as_str(), "key": "token" } } }));
    }
    let labels = json!({ K8S_MANAGED_BY.0: K8S_MANAGED_BY.1, "hypd.dev/download": "model" });
    let script = format!(
        "pip install --quiet --no-cache-dir --disable-pip-version-check '{HUB_CLIENT}' && exec python -u -c \"$HYPD_PROGRAM\""
    );
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {
            "name": name, "namespace": NAMESPACE, "labels": labels,
            "annotations": { "hypd.dev/model": r.model.as_str(), "hypd.dev/revision": r.revision() },
        },
        "spec": {
            "backoffLimit": 2,
            // A week to read what it printed, then Kubernetes removes it.
            "ttlSecondsAfterFinished": 604800,
            "template": {
                "metadata": { "labels": labels },
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{
                        "name": "download",
                        "image": IMAGE,
                        "command": ["bash", "-c", script],
                        "env": env,
                        "volumeMounts": [
                            { "name": "storage", "mountPath": mount },
                            { "name": "scratch", "mountPath": "/hypd-scratch" },
                        ],
                        "resources": { "requests": { "cpu": "1", "memory": "2Gi" } },
                    }],
                    "volumes": [
                        { "name": "storage", "persistentVolumeClaim": { "claimName": storage(r) } },
                        { "name": "scratch", "emptyDir": {} },
                    ],
                },
            },
        },
    }))
    .map_err(|e| ApiError::internal(format!("the download Job does not match its type: {e}")))
}

/// `hypd-progress files=3/7 bytes=…/… …` as people read it.
fn progress(line: &str) -> Option<String> {
    let rest = line.split("hypd-progress ").nth(1)?;
    let field = |k: &str| {
        rest.split_whitespace()
            .find_map(|w| w.strip_prefix(k).map(str::to_owned))
    };
    let files = field("files=")?;
    let (done, total) = field("bytes=")?
        .split_once('/')
        .and_then(|(d, t)| Some((d.parse::<u64>().ok()?, t.parse::<u64>().ok()?)))?;
    let mut said = format!("files {files}, {} of {}", bytes(done), bytes(total));
    if let Some(file) = field("file=") {
        said.push_str(&format!(" (last: {file})"));
    }
    if field("cached=").is_some() {
        said.push_str(", already there");
    }
    Some(said)
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Makes Job `job` unless it exists: a Job's template cannot change, and one already
/// made (by a run cut off after making it) is the one to follow.
async fn ensure_job(client: &kube::Client, job: Job) -> Result<(), ApiError> {
    let jobs = Api::<Job>::namespaced(client.clone(), NAMESPACE);
    let name = job.metadata.name.clone().unwrap_or_default();
    if !is_planning() && kubernetes::get(&jobs, &name).await?.is_some() {
        return Ok(());
    }
    converge(&Applied::namespaced(client, job)).await?;
    Ok(())
}

/// The newest pod of Job `name`: the last lines it printed (none while it starts), and
/// why it is not running, if it is not.
async fn last_lines(
    client: &kube::Client,
    name: &str,
) -> Result<(Vec<String>, Option<String>), ApiError> {
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    let mut newest: Option<Pod> = None;
    kubernetes::each_listed(
        &pods,
        ListParams::default().labels(&format!("job-name={name}")),
        |p| {
            let newer = newest.as_ref().is_none_or(|n| {
                p.metadata.creation_timestamp.as_ref().map(|t| t.0)
                    >= n.metadata.creation_timestamp.as_ref().map(|t| t.0)
            });
            if newer {
                newest = Some(p);
            }
        },
    )
    .await?;
    let Some(newest) = newest else {
        return Ok((Vec::new(), Some("no pod yet".to_owned())));
    };
    let waiting = kubernetes::not_running(&newest);
    let Some(pod) = newest.metadata.name else {
        return Ok((Vec::new(), waiting));
    };
    let params = LogParams {
        container: Some("download".into()),
        tail_lines: Some(20),
        ..LogParams::default()
    };
    match pods.logs(&pod, &params).await {
        Ok(text) => Ok((text.lines().map(str::to_owned).collect(), waiting)),
        // Still starting: nothing printed yet.
        Err(kube::Error::Api(s)) if s.code == 400 => Ok((Vec::new(), waiting)),
        Err(e) => Err(kubernetes::upstream(&format!("log Pod/{pod}"), e)),
    }
}

impl Pipeline for DownloadModel {
    type Stage = Stage;
    type Outputs = Outputs;

    /// Its own target: a download of one model queues behind another of the same model
    /// only, never behind (or in front of) changes of the cluster.
    fn target(&self) -> String {
        format!("cluster/{}/models/{}", self.name, self.model)
    }

    fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.idempotency_key.as_ref()
    }

    /// The storage is bucket-backed; another revision already there is refused unless
    /// `replace`; a Secret named for the token exists.
    async fn preflight(self, cx: &Preflight<'_>) -> Result<Self, ApiError> {
        let cluster = self.name.as_str();
        let (region, bucket, mount) = bucket_of(cx.aws, cx.store, cluster, storage(&self))
            .await
            .map_err(|e| match e {
                ApiError::NotFound { resource, name } if resource == "storage" => {
                    ApiError::field("storage", format!("{cluster} has no storage {name}"))
                }
                other => other,
            })?;
        let held = super::manifest(&cx.aws.s3(&region), &bucket, &self.prefix()).await?;
        if let Some(held) = held
            && held.revision != self.revision()
            && held.commit != self.revision()
            && !self.replace
        {
            return Err(ApiError::field(
                "revision",
                format!(
                    "{} holds {} (commit {}); send replace: true to download {} over it",
                    path_in_pods(&mount, &self.prefix()),
                    held.revision,
                    held.commit,
                    self.revision()
                ),
            ));
        }
        if let Some(secret) = &self.hf_token_secret {
            let client = kubernetes::connect(cx.aws, &region, cluster).await?;
            super::token::check_secret(&client, cluster, secret).await?;
        }
        Ok(self)
    }

    /// The token goes into a Secret of this download (`hypd-hf-token-…`, deleted once its
    /// Job finished) and out of the request.
    async fn keep_secrets(&mut self, cx: &Preflight<'_>) -> Result<(), ApiError> {
        let Some(token) = self.hf_token.take() else {
            return Ok(());
        };
        let region = region_of(cx.store, self.name.as_str()).await?;
        let client = kubernetes::connect(cx.aws, &region, self.name.as_str()).await?;
        // Its own: no other download (another user's) reads it, none overwrites it.
        let name = format!(
            "{TOKEN_SECRET}-{}",
            crate::clock::sortable_id("s").trim_start_matches("s-")
        );
        let kept = super::token::keep(&client, &name, Default::default(), &token).await?;
        self.hf_token_secret = Some(kept);
        Ok(())
    }

    /// A download that failed for good needs its token no more.
    async fn failed(&self, cx: &Context) -> Result<(), ApiError> {
        forget_token(self, cx).await
    }

    async fn step(
        &self,
        cx: &Context,
        stage: Stage,
        out: &mut Outputs,
    ) -> Result<Progress, ApiError> {
        let cluster = self.name.as_str();
        let (region, bucket, mount) = bucket_of(&cx.aws, &cx.store, cluster, storage(self)).await?;
        out.bucket = Some(bucket.clone());
        out.path_in_pods = Some(path_in_pods(&mount, &self.prefix()));
        let name = job_name(self.model.as_str(), &cx.operation_id, out.attempt);
        match stage {
            Stage::Job => {
                // A plan of a request with a token: the Secret is made when it is sent.
                if self.hf_token.is_some() {
                    planned(|| {
                        app::api::plan::Change::new(
                            app::api::plan::Action::Create,
                            "k8s:v1/Secret",
                            format!("{TOKEN_SECRET}-{}", app::api::plan::KNOWN_AFTER_APPLY),
                        )
                    });
                }
                let held = super::manifest(&cx.aws.s3(&region), &bucket, &self.prefix()).await?;
                // The commit asked for is there already: nothing to download.
                if held.as_ref().is_some_and(|h| h.commit == self.revision()) {
                    return Ok(Progress::Done);
                }
                // The same branch again may have moved: its newer commit replaces it.
                // Decided once: a run again must make the same Job.
                if out.job.is_none() {
                    out.replace =
                        self.replace || held.is_some_and(|h| h.revision == self.revision());
                }
                let client = kubernetes::connect(&cx.aws, &region, cluster).await?;
                ensure_job(&client, job(self, &name, &mount, out.replace)?).await?;
                out.job = Some(format!("{NAMESPACE}/{name}"));
                Ok(Progress::Done)
            }
            Stage::Download => {
                if is_planning() {
                    return Ok(Progress::Done);
                }
                if out.job.is_none() {
                    out.progress = Some("already there: no Job needed".to_owned());
                    return Ok(Progress::Done);
                }
                let client = kubernetes::connect(&cx.aws, &region, cluster).await?;
                let jobs = Api::<Job>::namespaced(client.clone(), NAMESPACE);
                let Some(found) = kubernetes::get(&jobs, &name).await? else {
                    // Deleted (by hand, a week after it finished, or after it failed and
                    // this is a retry): this attempt's Job is made again.
                    ensure_job(&client, job(self, &name, &mount, out.replace)?).await?;
                    out.job = Some(format!("{NAMESPACE}/{name}"));
                    return Ok(Progress::wait(POLL, format!("Job {NAMESPACE}/{name} made")));
                };
                let condition = |kind: &str| {
                    found
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| cs.iter().any(|c| c.type_ == kind && c.status == "True"))
                };
                let (lines, waiting) = last_lines(&client, &name).await?;
                if let Some(p) = lines.iter().rev().find_map(|l| progress(l)) {
                    out.progress = Some(p);
                }
                if condition("Complete") {
                    return Ok(Progress::Done);
                }
                if condition("Failed") {
                    let said = lines
                        .iter()
                        .rev()
                        .find_map(|l| l.split("hypd-error ").nth(1).map(str::to_owned))
                        .or_else(|| lines.last().cloned())
                        .unwrap_or_else(|| "it printed nothing".to_owned());
                    // A retry starts the next attempt's Job; this one's output is read
                    // above, and it goes (with its pods).
                    let gone = kube::api::DeleteParams::background();
                    match jobs.delete(&name, &gone).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(s)) if s.code == 404 => {}
                        Err(e) => {
                            return Err(kubernetes::upstream(&format!("delete Job/{name}"), e));
                        }
                    }
                    out.attempt += 1;
                    return Err(ApiError::Upstream {
                        service: "kubernetes".into(),
                        call: format!("Job {NAMESPACE}/{name}"),
                        code: Some("BackoffLimitExceeded".into()),
                        message: format!("the download failed: {said}"),
                        request_id: None,
                        transient: false,
                    });
                }
                Ok(Progress::wait(
                    POLL,
                    format!(
                        "downloading {} into {}: {}",
                        self.model,
                        out.path_in_pods.as_deref().unwrap_or_default(),
                        match (&out.progress, &waiting) {
                            (_, Some(w)) => format!("pod not running ({w})"),
                            (Some(p), None) => p.clone(),
                            (None, None) => "starting".to_owned(),
                        }
                    ),
                ))
            }
            Stage::Record => {
                if is_planning() {
                    return Ok(Progress::Done);
                }
                let held = super::manifest(&cx.aws.s3(&region), &bucket, &self.prefix())
                    .await?
                    .ok_or_else(|| {
                        ApiError::internal(format!(
                            "the Job {NAMESPACE}/{name} finished but s3://{bucket}/{}/{MANIFEST} is not there",
                            self.prefix()
                        ))
                    })?;
                out.commit = Some(held.commit);
                out.files = Some(held.files.len() as u32);
                out.size_bytes = Some(held.size_bytes);
                forget_token(self, cx).await?;
                Ok(Progress::Done)
            }
        }
    }
}

/// Deletes the Secret hypd made for the request's token, if it made one (a Secret the
/// user named is theirs, and stays).
async fn forget_token(r: &DownloadModel, cx: &Context) -> Result<(), ApiError> {
    let Some(name) = r
        .hf_token_secret
        .as_ref()
        .filter(|s| s.as_str().starts_with(&format!("{TOKEN_SECRET}-")))
    else {
        return Ok(());
    };
    if is_planning() {
        return Ok(());
    }
    let region = region_of(&cx.store, r.name.as_str()).await?;
    let client = kubernetes::connect(&cx.aws, &region, r.name.as_str()).await?;
    let mut secret = Secret::default();
    secret.metadata.name = Some(name.to_string());
    secret.metadata.namespace = Some(NAMESPACE.to_owned());
    converge(&Applied::namespaced(&client, secret).absent()).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_named_after_its_model_and_operation() {
        let a = job_name("meta-llama/Llama-3.2-1B-Instruct", "op-1", 0);
        assert!(
            a.starts_with("hypd-model-meta-llama-llama-3-2-1b-instruct-"),
            "{a}"
        );
        assert!(a.len() <= 63, "{a}");
        assert_ne!(a, job_name("meta-llama/Llama-3.2-1B-Instruct", "op-2", 0));
        assert_ne!(a, job_name("meta-llama/Llama-3.2-1B-Instruct", "op-1", 1));
        let long = job_name(&format!("{}/{}", "o".repeat(90), "m".repeat(90)), "op", 3);
        assert!(long.len() <= 63, "{long}");
    }

    #[test]
    fn progress_reads_as_people_read_it() {
        assert_eq!(
            progress("hypd-progress files=2/4 bytes=4096/8192 commit=abc file=model.safetensors")
                .as_deref(),
            Some("files 2/4, 4.0 KiB of 8.0 KiB (last: model.safetensors)")
        );
        assert_eq!(progress("step 3: loss=1.2"), None);
    }

    #[test]
    fn the_job_mounts_the_storage_and_reads_the_token_from_its_secret() {
        let r: DownloadModel = serde_json::from_value(serde_json::json!({
            "name": "ml-1", "model": "Qwen/Qwen2.5-0.5B", "hf_token_secret": "mine"}))
        .unwrap();
        let j = serde_json::to_value(job(&r, "hypd-model-x", "/s3", false).unwrap()).unwrap();
        let c = &j["spec"]["template"]["spec"]["containers"][0];
        let env = |n: &str| {
            c["env"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == n)
                .unwrap()
                .clone()
        };
        assert_eq!(
            env("HYPD_MODEL_DIR")["value"],
            "/s3/models/Qwen/Qwen2.5-0.5B"
        );
        assert_eq!(env("HF_TOKEN")["valueFrom"]["secretKeyRef"]["name"], "mine");
        // A public model's Job reads no token at all.
        let public: DownloadModel = serde_json::from_value(
            serde_json::json!({"name": "ml-1", "model": "Qwen/Qwen2.5-0.5B"}),
        )
        .unwrap();
        let j2 = serde_json::to_value(job(&public, "hypd-model-y", "/s3", false).unwrap()).unwrap();
        let env2 = &j2["spec"]["template"]["spec"]["containers"][0]["env"];
        assert!(
            env2.as_array()
                .unwrap()
                .iter()
                .all(|e| e["name"] != "HF_TOKEN"),
            "{env2}"
        );
        assert_eq!(
            j["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
            "shared-s3"
        );
    }
}
