//! Models in a cluster's storage: `download_model` fetches one from the Hugging Face hub
//! into `models/<org>/<name>/` of a storage (the shared bucket unless told), where every
//! pod that mounts it finds it (`/s3/models/<org>/<name>`), with a manifest beside the
//! files naming the commit the revision resolved to and each file's size and digest;
//! `list_models` reads those manifests. A Hugging Face token is a secret: hypd keeps it
//! only as a Kubernetes Secret of the one download in the cluster (deleted once its Job
//! finished), never in its store, logs or answers.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::command::{Command, CommandSpec, Effect, HttpMethod, Role};
use super::error::ApiError;
use super::operations::OperationRef;
use super::plan::Gated;
use super::values::{
    ClusterName, EksClusterName, HfModelId, HfRevision, IdempotencyKey, SecretName, StorageName,
};

/// The key prefix models go under, in every storage.
pub const MODELS_PREFIX: &str = "models";
/// The manifest a finished download writes beside the files.
pub const MANIFEST: &str = ".hypd-model.json";
/// The prefix of the Secret a token given with a download is kept in (namespace
/// `default`, key `token`): one per download, deleted once its Job finished.
pub const TOKEN_SECRET: &str = "hypd-hf-token";

/// A Hugging Face access token. Write-only: it is never printed (its `Debug` is
/// redacted), and a refused one is never quoted back.
#[derive(Clone, PartialEq, Eq)]
pub struct HfToken(String);

impl HfToken {
    pub fn parse(s: &str) -> Result<Self, String> {
        let ok = (8..=256).contains(&s.len())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            // Never the value: it is a secret, even a mistyped one.
            Err(format!(
                "a Hugging Face token is 8-256 letters, digits, '_' and '-' (hf_…); the value given ({} characters) is not one",
                s.chars().count()
            ))
        }
    }

    /// The token itself, for the one place it goes: the cluster's Secret.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for HfToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HfToken(redacted)")
    }
}

impl Serialize for HfToken {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for HfToken {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = Cow::<'de, str>::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for HfToken {
    fn schema_name() -> Cow<'static, str> {
        "HfToken".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "string", "minLength": 8, "maxLength": 256, "writeOnly": true })
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DownloadModel {
    /// The cluster.
    pub name: ClusterName,
    pub model: HfModelId,
    // Default main; resolved to a commit, which is recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<HfRevision>,
    // Default: the shared bucket (shared-s3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageName>,
    // For gated models: kept only as a Secret of this download in the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hf_token: Option<HfToken>,
    // A Secret of yours in default holding key `token`, instead of hf_token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hf_token_secret: Option<SecretName>,
    // Download over another revision already there (default: refused).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replace: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<IdempotencyKey>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

impl DownloadModel {
    pub fn revision(&self) -> &str {
        self.revision.as_ref().map_or("main", HfRevision::as_str)
    }

    /// The key prefix the model goes under, in its storage.
    pub fn prefix(&self) -> String {
        format!("{MODELS_PREFIX}/{}", self.model)
    }
}

impl Command for DownloadModel {
    type Output = Gated<OperationRef>;
    const SPEC: CommandSpec = CommandSpec {
        name: "download_model",
        summary: "Download a Hugging Face model into a cluster's storage",
        description: "Downloads a Hugging Face model into a storage (default: /s3/models/<model> in pods); a gated model's token stays in a Secret in the cluster. Returns an operation for wait_operation; dry_run returns the plan.",
        effect: Effect::Mutating,
        role: Role::Operator,
        idempotent: true,
        status_command: Some("get_operation"),
        method: HttpMethod::Post,
        path: "/api/v1/clusters/{name}/models",
    };

    super::command::dry_run_request!();

    fn validate(&self) -> Result<(), ApiError> {
        if self.hf_token.is_some() && self.hf_token_secret.is_some() {
            return Err(ApiError::field(
                "hf_token_secret",
                "give a token or the Secret that holds one, not both",
            ));
        }
        Ok(())
    }

    /// The token, and the Secret's name (a token pasted there by mistake), are blanked.
    fn redact(request: &mut serde_json::Value) {
        redact_tokens(request);
    }
}

/// Blanks a request's `hf_token` and `hf_token_secret` (a token pasted there by mistake)
/// before it is stored, logged or audited.
pub fn redact_tokens(request: &mut serde_json::Value) {
    for field in ["hf_token", "hf_token_secret"] {
        if let Some(value) = request.get_mut(field) {
            *value = serde_json::Value::String("(redacted)".into());
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListModels {
    /// The cluster.
    pub name: EksClusterName,
    // Default: the shared bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageName>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ModelList {
    pub name: String,
    pub storage: String,
    pub models: Vec<ModelEntry>,
    pub fetched_at: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ModelEntry {
    pub model: String,
    /// Where pods find it.
    pub path_in_pods: String,
    /// False: files without a manifest (a download running, failed or made by hand).
    pub complete: bool,
    pub revision: Option<String>,
    /// The commit the revision resolved to when it was downloaded.
    pub commit: Option<String>,
    pub files: Option<u32>,
    pub size_bytes: Option<u64>,
    pub downloaded_at: Option<String>,
}

impl Command for ListModels {
    type Output = ModelList;
    const SPEC: CommandSpec = CommandSpec {
        name: "list_models",
        summary: "List the models in a cluster's storage",
        description: "Models downloaded into a storage (default the shared bucket), with their path in pods, revision and commit.",
        effect: Effect::ReadOnly,
        role: Role::Viewer,
        idempotent: true,
        status_command: None,
        method: HttpMethod::Get,
        path: "/api/v1/clusters/{name}/models",
    };
}

/// The manifest a download writes beside the model's files.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub model: String,
    pub revision: String,
    pub commit: String,
    pub files: Vec<ManifestFile>,
    pub size_bytes: u64,
    pub downloaded_at: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ManifestFile {
    pub path: String,
    pub size_bytes: u64,
    pub sha256: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_never_shown() {
        let secret = "hf_abcdefghijklmnopqrstuvwxyz012345";
        let t = HfToken::parse(secret).unwrap();
        assert!(!format!("{t:?}").contains("abcdef"));
        let bad = format!("{secret}!");
        let e = HfToken::parse(&bad).unwrap_err();
        assert!(!e.contains("abcdef"), "{e}");
        let r: DownloadModel = serde_json::from_value(serde_json::json!({
            "name": "ml-1", "model": "meta-llama/Llama-3.2-1B", "hf_token": secret}))
        .unwrap();
        assert!(!format!("{r:?}").contains("abcdef"));
        let mut v = serde_json::to_value(&r).unwrap();
        DownloadModel::redact(&mut v);
        assert!(!v.to_string().contains("abcdef"), "{v}");
        assert_eq!(r.prefix(), "models/meta-llama/Llama-3.2-1B");
        assert_eq!(r.revision(), "main");
    }

    #[test]
    fn model_ids_and_revisions_follow_the_hub() {
        assert!(HfModelId::parse("Qwen/Qwen2.5-0.5B-Instruct").is_ok());
        for bad in ["llama", "a/b/c", "a/../b", "-a/b", "a/b--c", "/b"] {
            assert!(HfModelId::parse(bad).is_err(), "{bad}");
        }
        assert!(HfRevision::parse("refs/pr/1").is_ok());
        for bad in ["", "../x", "-x", "x/"] {
            assert!(HfRevision::parse(bad).is_err(), "{bad}");
        }
    }
}
