//! FSx for Lustre objects hypd makes for a storage: its file system and the file
//! system's data repository associations. FSx objects have no names, so hypd finds its
//! own by tags (`hypd:cluster`, `hypd:storage`) and makes each with a client request
//! token, so a create whose answer was lost is not made twice.

pub mod association;
pub mod file_system;

use aws_sdk_fsx::types::Tag;

pub use aws_sdk_fsx::Client;

use super::tags;

/// hypd's tags for an object of storage `storage` of `cluster`.
pub(crate) fn storage_tags(cluster: &str, storage: &str) -> Vec<Tag> {
    tags::of_cluster(cluster)
        .into_iter()
        .chain([(tags::STORAGE, storage.to_owned())])
        .chain([("Name", format!("{cluster}-{storage}"))])
        .map(|(k, v)| Tag::builder().key(k).value(v).build())
        .collect()
}

/// Whether `tags` say the object is storage `storage` of `cluster`.
pub(crate) fn is_storage(tags: &[Tag], cluster: &str, storage: &str) -> bool {
    let pairs = || tags.iter().filter_map(|t| Some((t.key()?, t.value()?)));
    tags::belongs_to(pairs(), cluster) && pairs().any(|(k, v)| k == tags::STORAGE && v == storage)
}

/// A client request token (at most 63 characters) for the `what` create of operation
/// `operation`: the same across retries of that operation, new for the next one.
pub(crate) fn token(operation: &str, what: &str) -> String {
    let t = format!("hypd-{operation}-{what}");
    t.chars().take(63).collect()
}
