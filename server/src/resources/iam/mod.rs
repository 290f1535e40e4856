//! IAM objects hypd makes: roles (a trust policy, managed policies attached, inline
//! policies) and OIDC providers. Names are derived from the cluster, so a step run again
//! finds what it made by name; IAM answers are URL-encoded JSON documents, compared as
//! JSON values.

pub mod oidc_provider;
pub mod policy;
pub mod role;

use aws_sdk_iam::types::Tag;
use sha2::{Digest, Sha256};

use super::tags;

pub use aws_sdk_iam::Client;

/// `hypd-<cluster>-<suffix>`, shortened with a hash when it would pass IAM's 64
/// characters, so every cluster name maps to one valid role name.
pub fn role_name(cluster: &str, suffix: &str) -> String {
    let name = format!("hypd-{cluster}-{suffix}");
    if name.len() <= 64 {
        return name;
    }
    let hash = format!("{:x}", Sha256::digest(cluster.as_bytes()));
    let keep = 64 - (5 + 1 + 8 + 1 + suffix.len());
    format!("hypd-{}-{}-{suffix}", &cluster[..keep], &hash[..8])
}

pub(crate) fn cluster_tags(cluster: &str) -> Vec<Tag> {
    tags::of_cluster(cluster)
        .iter()
        .filter_map(|(k, v)| Tag::builder().key(*k).value(v).build().ok())
        .collect()
}

pub(crate) fn pairs(tags: &[Tag]) -> impl Iterator<Item = (&str, &str)> {
    tags.iter().map(|t| (t.key(), t.value()))
}

/// An IAM policy document as IAM answers it: URL-encoded JSON (RFC 3986), or plain JSON
/// from implementations that do not encode it.
pub fn document(raw: &str) -> serde_json::Value {
    serde_json::from_str(raw)
        .or_else(|_| serde_json::from_str(&app::text::percent_decode(raw)))
        .unwrap_or(serde_json::Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_names_fit_iam() {
        assert_eq!(role_name("ml-1", "eks"), "hypd-ml-1-eks");
        let long = "a".repeat(63);
        let n = role_name(&long, "hyperpod");
        assert_eq!(n.len(), 64, "{n}");
        assert!(n.starts_with("hypd-aaaa") && n.ends_with("-hyperpod"));
        assert_ne!(n, role_name(&format!("{}b", "a".repeat(62)), "hyperpod"));
    }

    #[test]
    fn documents_read_encoded_or_plain() {
        let plain = r#"{"Version":"2012-10-17","Statement":[]}"#;
        let encoded = "%7B%22Version%22%3A%222012-10-17%22%2C%22Statement%22%3A%5B%5D%7D";
        assert_eq!(document(plain), document(encoded));
        assert_eq!(document(plain)["Version"], "2012-10-17");
    }
}
