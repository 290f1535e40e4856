//! Hugging Face tokens in a cluster: the one place a token goes is a Secret (namespace
//! `default`, key `token`) that pods read it from, written before the operation that
//! needs it is stored, so hypd's store, logs and answers never hold one; a Secret of the
//! user's named instead must hold a token under that key.

use std::collections::BTreeMap;

use app::api::ApiError;
use app::api::models::HfToken;
use app::api::values::SecretName;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use crate::cluster::storage::NAMESPACE;
use crate::resources::converge;
use crate::resources::kube::object::Applied;
use crate::resources::kube::{self as kubernetes};
use crate::resources::tags::K8S_MANAGED_BY;

/// Refuses, at `hf_token_secret`, a Secret of cluster `cluster` that is not there or
/// holds no token under key `token`.
pub(crate) async fn check_secret(
    client: &kube::Client,
    cluster: &str,
    secret: &SecretName,
) -> Result<(), ApiError> {
    let secrets = Api::<Secret>::namespaced(client.clone(), NAMESPACE);
    let found = kubernetes::get(&secrets, secret.as_str()).await?;
    let holds = found.is_some_and(|s| {
        s.data.is_some_and(|d| d.contains_key("token"))
            || s.string_data.is_some_and(|d| d.contains_key("token"))
    });
    if holds {
        Ok(())
    } else {
        Err(ApiError::field(
            "hf_token_secret",
            format!(
                "{cluster} has no Secret {NAMESPACE}/{secret} with the token under key `token`"
            ),
        ))
    }
}

/// Keeps `token` in Secret `name`, labelled hypd's (so hypd deletes it) and with
/// `labels`; answers its name, for the request to carry instead of the token.
pub(crate) async fn keep(
    client: &kube::Client,
    name: &str,
    labels: BTreeMap<String, String>,
    token: &HfToken,
) -> Result<SecretName, ApiError> {
    let mut secret = Secret::default();
    secret.metadata.name = Some(name.to_owned());
    secret.metadata.namespace = Some(NAMESPACE.to_owned());
    let mut labels = labels;
    labels.insert(K8S_MANAGED_BY.0.to_owned(), K8S_MANAGED_BY.1.to_owned());
    secret.metadata.labels = Some(labels);
    secret.type_ = Some("Opaque".to_owned());
    secret.data = Some(
        [(
            "token".to_owned(),
            ByteString(token.expose().as_bytes().to_vec()),
        )]
        .into(),
    );
    converge(&Applied::namespaced(client, secret)).await?;
    SecretName::parse(name).map_err(ApiError::internal)
}
