//! A cluster's shared bucket. Present: created (with hypd's tags) when it does not exist;
//! a bucket the user named and that exists is used as it is, and one that belongs to
//! another account is a field error; a bucket whose name only hypd makes (`adopt`) and
//! that has no tags is one whose creation's answer was lost or whose tagging a crash cut
//! off, and is tagged now. Absent: deleted only if hypd's tags are on it and it
//! holds nothing but `keep_prefix` (hypd's own files): data outlives clusters.

use app::api::ApiError;
use app::api::plan::{Action, Change};
use aws_sdk_s3::types::{
    BucketLocationConstraint, CreateBucketConfiguration, PublicAccessBlockConfiguration,
    ServerSideEncryption, ServerSideEncryptionByDefault, ServerSideEncryptionConfiguration,
    ServerSideEncryptionRule, Tag, Tagging,
};
use serde_json::json;

use super::Client;
use crate::aws::SdkResultExt;
use crate::resources::{Resource, Want, tags};

const KIND: &str = "s3:Bucket";

pub struct Bucket {
    pub s3: Client,
    pub name: String,
    pub region: String,
    pub cluster: String,
    pub want: Want<()>,
    /// Absent: which keys are hypd's own, which may be deleted with it.
    pub hypd_files: Files,
    /// The request field a name taken by another account is blamed on.
    pub field: &'static str,
    /// Only hypd makes a bucket of this name: found untagged in this account, it is
    /// hypd's own, cut off between CreateBucket and PutBucketTagging.
    pub adopt: bool,
    /// A bucket hypd creates gets public access blocked and default encryption set
    /// explicitly (new buckets have both in AWS today; a policy or an older default
    /// must not decide it for a bucket hypd mounts in pods).
    pub harden: bool,
}

/// Which keys of a bucket are hypd's own files (so a bucket holding only them may go).
#[derive(Clone, Debug, PartialEq)]
pub enum Files {
    /// Every key: a bucket only hypd's components write to.
    All,
    /// Keys under this prefix (the lifecycle scripts); the rest is data.
    Under(String),
    /// None: every key is the user's data.
    None,
}

impl Files {
    fn holds(&self, key: &str) -> bool {
        match self {
            Files::All => true,
            Files::Under(prefix) => key.starts_with(prefix.as_str()),
            Files::None => false,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    pub exists: bool,
    /// Carries hypd's tags for this cluster.
    pub ours: bool,
    /// Absent only: every key, to tell hypd's files from data.
    pub keys: Vec<String>,
    /// This converge created it.
    pub created: bool,
}

impl Observed {
    /// Keys that are not hypd's own files.
    pub fn data(&self, hypd_files: &Files) -> usize {
        self.keys.iter().filter(|k| !hypd_files.holds(k)).count()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Create,
    Tag,
    DeleteObject(String),
    Delete,
}

/// The changes for `want` given what was found. Pure.
pub fn diff(want: &Want<()>, o: &Observed, hypd_files: &Files, adopt: bool) -> Vec<Op> {
    match want {
        Want::Present(()) if !o.exists => vec![Op::Create],
        Want::Present(()) if !o.ours && adopt => vec![Op::Tag],
        Want::Absent if o.exists && (o.ours || adopt) && o.data(hypd_files) == 0 => {
            let mut ops: Vec<Op> = o.keys.iter().cloned().map(Op::DeleteObject).collect();
            ops.push(Op::Delete);
            ops
        }
        _ => Vec::new(),
    }
}

impl Bucket {
    async fn tag(&self) -> Result<(), ApiError> {
        let tag_set = tags::of_cluster(&self.cluster)
            .iter()
            .map(|(k, v)| Tag::builder().key(*k).value(v).build())
            .collect::<Result<Vec<_>, _>>()
            .map_err(ApiError::internal)?;
        let tagging = Tagging::builder()
            .set_tag_set(Some(tag_set))
            .build()
            .map_err(ApiError::internal)?;
        self.s3
            .put_bucket_tagging()
            .bucket(&self.name)
            .tagging(tagging)
            .send()
            .await
            .upstream("s3", "PutBucketTagging")?;
        Ok(())
    }

    /// Blocks public access and sets SSE-S3 default encryption, when `harden`. Both
    /// calls set the whole configuration, so sending them again changes nothing.
    async fn secure(&self) -> Result<(), ApiError> {
        if !self.harden {
            return Ok(());
        }
        let block = PublicAccessBlockConfiguration::builder()
            .block_public_acls(true)
            .ignore_public_acls(true)
            .block_public_policy(true)
            .restrict_public_buckets(true)
            .build();
        self.s3
            .put_public_access_block()
            .bucket(&self.name)
            .public_access_block_configuration(block)
            .send()
            .await
            .upstream("s3", "PutPublicAccessBlock")?;
        let rule = ServerSideEncryptionRule::builder()
            .apply_server_side_encryption_by_default(
                ServerSideEncryptionByDefault::builder()
                    .sse_algorithm(ServerSideEncryption::Aes256)
                    .build()
                    .map_err(ApiError::internal)?,
            )
            .build();
        let encryption = ServerSideEncryptionConfiguration::builder()
            .rules(rule)
            .build()
            .map_err(ApiError::internal)?;
        self.s3
            .put_bucket_encryption()
            .bucket(&self.name)
            .server_side_encryption_configuration(encryption)
            .send()
            .await
            .upstream("s3", "PutBucketEncryption")?;
        Ok(())
    }

    /// Why a bucket that teardown leaves in place stays, if it does.
    pub fn kept(&self, o: &Observed) -> Option<String> {
        let data = o.data(&self.hypd_files);
        let besides = match self.hypd_files {
            Files::None => "",
            _ => " besides hypd's own files",
        };
        (o.exists && o.ours && data > 0).then(|| {
            format!(
                "kept bucket {}: it holds {data} objects{besides}",
                self.name
            )
        })
    }
}

impl Resource for Bucket {
    type Observed = Observed;
    type Op = Op;

    async fn observe(&self) -> Result<Observed, ApiError> {
        if self
            .s3
            .head_bucket()
            .bucket(&self.name)
            .send()
            .await
            .found("s3", "HeadBucket")?
            .is_none()
        {
            return Ok(Observed::default());
        }
        let ours = self
            .s3
            .get_bucket_tagging()
            .bucket(&self.name)
            .send()
            .await
            .found("s3", "GetBucketTagging")?
            .is_some_and(|t| {
                tags::belongs_to(
                    t.tag_set().iter().map(|t| (t.key(), t.value())),
                    &self.cluster,
                )
            });
        let mut keys = Vec::new();
        if self.want == Want::Absent && (ours || self.adopt) {
            let mut pages = self
                .s3
                .list_objects_v2()
                .bucket(&self.name)
                .into_paginator()
                .send();
            while let Some(page) = pages.next().await {
                let page = page.upstream("s3", "ListObjectsV2")?;
                keys.extend(
                    page.contents()
                        .iter()
                        .filter_map(|o| o.key().map(str::to_owned)),
                );
            }
        }
        Ok(Observed {
            exists: true,
            ours,
            keys,
            created: false,
        })
    }

    fn diff(&self, observed: &Observed) -> Result<Vec<Op>, ApiError> {
        Ok(diff(&self.want, observed, &self.hypd_files, self.adopt))
    }

    async fn apply(&self, op: &Op, o: &mut Observed) -> Result<(), ApiError> {
        match op {
            Op::Create => {
                let mut req = self.s3.create_bucket().bucket(&self.name);
                // us-east-1 is the one region that refuses an explicit location.
                if self.region != "us-east-1" {
                    req = req.create_bucket_configuration(
                        CreateBucketConfiguration::builder()
                            .location_constraint(BucketLocationConstraint::from(
                                self.region.as_str(),
                            ))
                            .build(),
                    );
                }
                match req
                    .send()
                    .await
                    .allowing("s3", "CreateBucket", &["BucketAlreadyOwnedByYou"])
                {
                    Ok(_) => {}
                    Err(ApiError::Upstream { code: Some(c), .. }) if c == "BucketAlreadyExists" => {
                        return Err(ApiError::field(
                            self.field,
                            format!(
                                "bucket {} belongs to another account; choose another name",
                                self.name
                            ),
                        ));
                    }
                    Err(e) => return Err(e),
                }
                self.secure().await?;
                self.tag().await?;
                *o = Observed {
                    exists: true,
                    ours: true,
                    keys: Vec::new(),
                    created: true,
                };
            }
            Op::Tag => {
                // Cut off after CreateBucket: it may have missed its settings as well.
                self.secure().await?;
                self.tag().await?;
                o.ours = true;
            }
            Op::DeleteObject(key) => {
                self.s3
                    .delete_object()
                    .bucket(&self.name)
                    .key(key)
                    .send()
                    .await
                    .found("s3", "DeleteObject")?;
                o.keys.retain(|k| k != key);
            }
            Op::Delete => {
                self.s3
                    .delete_bucket()
                    .bucket(&self.name)
                    .send()
                    .await
                    .found("s3", "DeleteBucket")?;
                *o = Observed::default();
            }
        }
        Ok(())
    }

    fn describe(&self, op: &Op, _: &Observed) -> Change {
        match op {
            Op::Create => Change::new(Action::Create, KIND, &self.name).field(
                "region",
                None,
                Some(json!(self.region)),
            ),
            Op::Tag => Change::new(Action::Update, KIND, &self.name).field(
                "tags",
                None,
                Some(json!(tags::of_cluster(&self.cluster))),
            ),
            Op::DeleteObject(key) => {
                Change::new(Action::Delete, "s3:Object", format!("{}/{key}", self.name))
            }
            Op::Delete => Change::new(Action::Delete, KIND, &self.name),
        }
    }
    fn assume(&self, op: &Op, o: &mut Observed) {
        match op {
            Op::Create => {
                *o = Observed {
                    exists: true,
                    ours: true,
                    keys: Vec::new(),
                    created: true,
                }
            }
            Op::Tag => o.ours = true,
            Op::DeleteObject(key) => o.keys.retain(|k| k != key),
            Op::Delete => *o = Observed::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_with_data_is_kept() {
        let lifecycle = Files::Under("hypd/lifecycle".into());
        let o = Observed {
            exists: true,
            ours: true,
            keys: vec!["hypd/lifecycle/on_create.sh".into()],
            created: false,
        };
        assert_eq!(
            diff(&Want::Absent, &o, &lifecycle, false),
            [
                Op::DeleteObject("hypd/lifecycle/on_create.sh".into()),
                Op::Delete
            ]
        );
        let with_data = Observed {
            keys: vec!["hypd/lifecycle/on_create.sh".into(), "data/x".into()],
            ..o.clone()
        };
        assert!(diff(&Want::Absent, &with_data, &lifecycle, false).is_empty());
        let theirs = Observed {
            ours: false,
            ..o.clone()
        };
        assert!(diff(&Want::Absent, &theirs, &lifecycle, false).is_empty());
        // A storage's bucket: every key is data, so only an empty one goes.
        assert!(diff(&Want::Absent, &o, &Files::None, false).is_empty());
        let empty = Observed {
            keys: Vec::new(),
            ..o.clone()
        };
        assert_eq!(
            diff(&Want::Absent, &empty, &Files::None, false),
            [Op::Delete]
        );
        assert_eq!(
            diff(&Want::Present(()), &Observed::default(), &Files::All, false),
            [Op::Create]
        );
        // Untagged: the user's, unless only hypd makes a bucket of that name.
        assert!(diff(&Want::Present(()), &theirs, &Files::All, false).is_empty());
        assert_eq!(
            diff(&Want::Present(()), &theirs, &Files::All, true),
            [Op::Tag]
        );
    }
}
