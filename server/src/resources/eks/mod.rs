//! EKS objects hypd makes or changes: the control plane, its add-ons, access entries and
//! pod identity associations. Creating calls carry a client request token derived from
//! the object, so a call repeated after a crash is recognised by EKS as the same request.

pub mod access_entry;
pub mod addon;
pub mod cluster;
pub mod pod_identity;

use std::collections::HashMap;

pub use aws_sdk_eks::Client;

use super::tags;

/// hypd's tags as EKS takes them.
pub(crate) fn cluster_tags(cluster: &str) -> HashMap<String, String> {
    tags::of_cluster(cluster)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
}

/// EKS's health issues as one line each.
pub(crate) fn issues<'a>(
    issues: impl IntoIterator<Item = (Option<&'a str>, Option<&'a str>)>,
) -> Vec<String> {
    issues
        .into_iter()
        .map(|(code, message)| match (code, message) {
            (Some(c), Some(m)) => format!("{c}: {m}"),
            (c, m) => c.or(m).unwrap_or("unspecified").to_owned(),
        })
        .collect()
}
