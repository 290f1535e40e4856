//! The container of a model download (hypd's `download_model` Job): what its program
//! does to storage, since the sim runs no program. A container whose environment names
//! `HYPD_MODEL_ID` writes the model's snapshot from the sim's [`hub`](crate::hub) into
//! the bucket behind the directory `HYPD_MODEL_DIR` it mounts — found as Mountpoint
//! finds it: the volume mounted there, its claim, the claim's volume, the bucket it
//! names — with the manifest (`.hypd-model.json`: commit, files, sizes, digests) last.
//! The container exits only once its files are written, as a real one exits after its
//! last write returns, so a Job that reports Complete has its files in the bucket.

use serde_json::{Value, json};

use crate::hub;
use crate::kube::store::{Key, Store, meta};
use crate::moto::Moto;

/// The environment variables hypd's download Job sets.
pub const MODEL_ENV: &str = "HYPD_MODEL_ID";
const REVISION_ENV: &str = "HYPD_MODEL_REVISION";
const DIR_ENV: &str = "HYPD_MODEL_DIR";
/// The manifest's name in the model's directory.
pub const MANIFEST: &str = ".hypd-model.json";
/// Set on the pod once its files are written (or writing failed): it may exit.
pub const WRITTEN_ANNOTATION: &str = "sim.hypd.dev/output-written";

/// The model, revision and directory of a pod's download container, if it has one.
pub fn of(pod: &Value) -> Option<(String, String, String)> {
    pod["spec"]["containers"].as_array()?.iter().find_map(|c| {
        let env = |name: &str| {
            c["env"].as_array()?.iter().find_map(|e| {
                (e["name"] == name)
                    .then(|| e["value"].as_str().map(str::to_owned))
                    .flatten()
            })
        };
        Some((
            env(MODEL_ENV)?,
            env(REVISION_ENV).unwrap_or_else(|| "main".into()),
            env(DIR_ENV)?,
        ))
    })
}

/// Whether the pod's download container still has files to write: it cannot exit yet.
pub fn writing(pod: &Value) -> bool {
    of(pod).is_some() && pod["metadata"]["annotations"][WRITTEN_ANNOTATION].is_null()
}

/// A download to carry out.
pub struct Download {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    pub model: String,
    pub revision: String,
    /// The bucket and key prefix the directory is in; `None` when it is not on a
    /// bucket-backed volume (the files would go to the container's own disk).
    pub target: Option<(String, String)>,
}

/// The running download containers whose files are not written yet.
pub(super) fn pending(store: &Store) -> Vec<Download> {
    store
        .list("/pods", None)
        .filter(|p| p["status"]["phase"] == "Running" && writing(p))
        .filter_map(|pod| {
            let (model, revision, dir) = of(pod)?;
            let namespace = meta(pod, "namespace");
            Some(Download {
                target: target(store, pod, &namespace, &dir),
                namespace,
                pod: meta(pod, "name"),
                uid: meta(pod, "uid"),
                model,
                revision,
            })
        })
        .collect()
}

/// The bucket and key prefix of `dir` in `pod`, as the mounts resolve it.
fn target(store: &Store, pod: &Value, ns: &str, dir: &str) -> Option<(String, String)> {
    let mounts = pod["spec"]["containers"]
        .as_array()?
        .iter()
        .flat_map(|c| c["volumeMounts"].as_array().into_iter().flatten());
    let (volume, rest) = mounts
        .filter_map(|m| {
            let at = m["mountPath"].as_str()?.trim_end_matches('/');
            let rest = dir.strip_prefix(at)?;
            let name = m["name"].as_str()?.to_owned();
            (rest.is_empty() || rest.starts_with('/')).then_some((name, rest))
        })
        .max_by_key(|(_, rest)| std::cmp::Reverse(rest.len()))?;
    let claim = pod["spec"]["volumes"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == volume.as_str())?["persistentVolumeClaim"]["claimName"]
        .as_str()?
        .to_owned();
    let pvc = store.get(&Key::new("/persistentvolumeclaims", ns, &claim))?;
    let pv_name = pvc["spec"]["volumeName"].as_str()?;
    let pv = store.get(&Key::new("/persistentvolumes", "", pv_name))?;
    let bucket = pv["spec"]["csi"]["volumeAttributes"]["bucketName"].as_str()?;
    Some((bucket.to_owned(), rest.trim_matches('/').to_owned()))
}

/// Writes the snapshot, then its manifest, into the bucket; the first failure's message.
pub async fn write(moto: &Moto, region: &str, d: &Download, now: &str) -> Result<(), String> {
    let Some((bucket, prefix)) = &d.target else {
        return Ok(());
    };
    let snapshot = hub::snapshot(&d.model, &d.revision);
    let key = |path: &str| match prefix.as_str() {
        "" => path.to_owned(),
        p => format!("{p}/{path}"),
    };
    for f in &snapshot.files {
        moto.put_object(region, bucket, &key(&f.path), f.bytes.clone())
            .await?;
    }
    let files: Vec<Value> = snapshot
        .files
        .iter()
        .map(|f| json!({"path": f.path, "size_bytes": f.bytes.len(), "sha256": hub::sha256(&f.bytes)}))
        .collect();
    let total: usize = snapshot.files.iter().map(|f| f.bytes.len()).sum();
    let manifest = json!({
        "model": d.model, "revision": d.revision, "commit": snapshot.commit,
        "files": files, "size_bytes": total, "downloaded_at": now,
    });
    moto.put_object(
        region,
        bucket,
        &key(MANIFEST),
        manifest.to_string().into_bytes(),
    )
    .await
}

/// Lets the pod's container exit: with 0 once written, 1 when writing failed.
pub(super) fn written(store: &mut Store, d: &Download, failed: Option<&str>) {
    let key = Key::new("/pods", &d.namespace, &d.pod);
    let Some(pod) = store.get(&key) else {
        return;
    };
    if meta(pod, "uid") != d.uid {
        return;
    }
    let mut pod = (**pod).clone();
    let annotations = &mut pod["metadata"]["annotations"];
    if !annotations.is_object() {
        *annotations = json!({});
    }
    annotations[WRITTEN_ANNOTATION] = json!("true");
    if let Some(message) = failed {
        annotations[super::pods::EXIT_ANNOTATION] = json!("1");
        annotations["sim.hypd.dev/output-error"] = json!(message);
    }
    store.put(key, pod);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_download_directory_resolves_to_its_bucket_through_the_mounts() {
        let mut store = Store::new();
        store.put(
            Key::new("/persistentvolumes", "", "s3-b"),
            json!({"metadata": {"name": "s3-b"}, "spec": {"csi": {"volumeAttributes": {"bucketName": "b"}}}}),
        );
        store.put(
            Key::new("/persistentvolumeclaims", "default", "shared-s3"),
            json!({"metadata": {"name": "shared-s3", "namespace": "default"}, "spec": {"volumeName": "s3-b"}}),
        );
        let pod = json!({"metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {"containers": [{"name": "download",
                "env": [{"name": MODEL_ENV, "value": "org/m"}, {"name": DIR_ENV, "value": "/s3/models/org/m"}],
                "volumeMounts": [{"name": "data", "mountPath": "/s3"}]}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "shared-s3"}}]}});
        assert_eq!(of(&pod).unwrap().1, "main");
        assert!(writing(&pod));
        assert_eq!(
            target(&store, &pod, "default", "/s3/models/org/m"),
            Some(("b".to_owned(), "models/org/m".to_owned()))
        );
    }
}
