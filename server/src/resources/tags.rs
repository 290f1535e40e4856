//! The tags and labels that mark what hypd made, defined once. Every AWS object hypd
//! creates carries `hypd:managed=true` and `hypd:cluster=<name>` from its creating call, so
//! a crash between a create and its tagging cannot leave an object hypd would not
//! recognise, and teardown removes exactly what carries them.

/// Marks an AWS object as made by hypd.
pub const MANAGED: &str = "hypd:managed";
/// The hypd cluster an AWS object belongs to.
pub const CLUSTER: &str = "hypd:cluster";
/// Which of a cluster's objects of one kind this is (`vpc`, `public-1`, `nat`, …).
pub const ROLE: &str = "hypd:role";
/// The storage (claim name) an FSx file system was made for.
pub const STORAGE: &str = "hypd:storage";

/// The label of Kubernetes objects hypd applies.
pub const K8S_MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "hypd");

/// The two tags of every AWS object hypd makes for `cluster`.
pub fn of_cluster(cluster: &str) -> [(&'static str, String); 2] {
    [(MANAGED, "true".to_owned()), (CLUSTER, cluster.to_owned())]
}

/// True when the tags (key, value pairs) say the object is hypd's for `cluster`.
pub fn belongs_to<'a>(tags: impl IntoIterator<Item = (&'a str, &'a str)>, cluster: &str) -> bool {
    tags.into_iter().any(|(k, v)| k == CLUSTER && v == cluster)
}

/// True when the tags (key, value pairs) say hypd made the object (for any cluster).
pub fn managed<'a>(tags: impl IntoIterator<Item = (&'a str, &'a str)>) -> bool {
    tags.into_iter().any(|(k, v)| k == MANAGED && v == "true")
}

/// The same, for SDKs that answer tags as a map (EKS).
pub fn map_belongs_to(
    tags: Option<&std::collections::HashMap<String, String>>,
    cluster: &str,
) -> bool {
    tags.is_some_and(|t| belongs_to(t.iter().map(|(k, v)| (k.as_str(), v.as_str())), cluster))
}

/// The same, for SDKs that answer tags as a map (EKS).
pub fn map_managed(tags: Option<&std::collections::HashMap<String, String>>) -> bool {
    tags.is_some_and(|t| managed(t.iter().map(|(k, v)| (k.as_str(), v.as_str()))))
}
