//! `check_storage`: what would leave pods in ContainerCreating, found before they are
//! started. A mount fails quietly in the node's driver, far from whoever submitted the
//! job, so each rule reads the very thing the driver will use (its add-on, its role's
//! policies, the volume, the claim, the bucket; for FSx the file system, its security
//! groups and the nodes' Lustre clients, in `fsx::check`) and says which command fixes
//! it. The driver's half is also the pre-flight of `create_s3_storage`.

use std::collections::BTreeMap;

use app::api::ApiError;
use app::api::storage::{CheckStorage, StorageCheck, StorageFinding};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Api;
use kube::api::ListParams;
use serde_json::Value;

use super::{driver_role, region_of};
use crate::auth::Actor;
use crate::aws::{Aws, SdkResultExt};
use crate::cluster::addons::S3_CSI_SERVICE_ACCOUNT;
use crate::cluster::identity::s3_csi_inline_policy;
use crate::cluster::storage::{DRIVER, NAMESPACE, STORAGE_LABEL};
use crate::resources::eks::addon::Addon;
use crate::resources::iam::document;
use crate::resources::iam::role::Role;
use crate::resources::kube as kubernetes;
use crate::resources::{Resource, Want};
use crate::service::{Handler, Service};

/// The EKS add-on that brings the Mountpoint for S3 driver.
const DRIVER_ADDON: &str = "aws-mountpoint-s3-csi-driver";

/// Findings as they are found.
#[derive(Default)]
pub(crate) struct Findings(Vec<StorageFinding>);

impl Findings {
    pub(crate) fn add(
        &mut self,
        storage: Option<&str>,
        check: &str,
        error: bool,
        message: String,
        fix: Option<String>,
    ) {
        self.0.push(StorageFinding {
            storage: storage.map(str::to_owned),
            check: check.to_owned(),
            severity: if error { "error" } else { "warning" }.to_owned(),
            message,
            fix,
        });
    }

    /// The first error as a refusal naming `field`, with its fix.
    pub fn refuse(&self, field: &str) -> Result<(), ApiError> {
        match self.0.iter().find(|f| f.severity == "error") {
            Some(f) => Err(ApiError::field(
                field,
                match &f.fix {
                    Some(fix) => format!("{} (fix: {fix})", f.message),
                    None => f.message.clone(),
                },
            )),
            None => Ok(()),
        }
    }
}

/// The driver's half: its add-on installed and active, and a role bound to its service
/// account. The role's name when it has one.
pub(crate) async fn driver(
    aws: &Aws,
    region: &str,
    cluster: &str,
    findings: &mut Findings,
) -> Result<Option<String>, ApiError> {
    let addon = Addon {
        eks: aws.eks(region),
        cluster: cluster.to_owned(),
        name: DRIVER_ADDON.to_owned(),
        want: Want::Absent,
        configuration: None,
    };
    match addon.observe().await? {
        None => findings.add(
            None,
            "driver",
            true,
            format!("the Mountpoint for S3 driver ({DRIVER_ADDON}) is not installed on {cluster}"),
            Some(format!(
                "aws eks create-addon --cluster-name {cluster} --addon-name {DRIVER_ADDON} --region {region}"
            )),
        ),
        Some(state) if !state.active() => {
            let failed = state.check(DRIVER_ADDON).is_err();
            findings.add(
                None,
                "driver",
                failed,
                format!("{} {}", state.describe(DRIVER_ADDON), state.issues.join("; ")).trim_end().to_owned(),
                failed.then(|| {
                    format!(
                        "aws eks describe-addon --cluster-name {cluster} --addon-name {DRIVER_ADDON} --region {region}"
                    )
                }),
            );
        }
        Some(_) => {}
    }
    let role = driver_role(aws, region, cluster).await?;
    if role.is_none() {
        let (namespace, account) = S3_CSI_SERVICE_ACCOUNT;
        findings.add(
            None,
            "driver_role",
            true,
            format!("the driver's service account {namespace}/{account} has no role: it cannot read any bucket"),
            Some(format!(
                "aws eks create-pod-identity-association --cluster-name {cluster} --namespace {namespace} --service-account {account} --role-arn <a role allowed the buckets> --region {region}"
            )),
        );
    }
    Ok(role)
}

impl Handler<CheckStorage> for Service {
    async fn handle(&self, _: &Actor, r: CheckStorage) -> Result<StorageCheck, ApiError> {
        let cluster = r.name.as_str();
        let region = region_of(&self.store, cluster).await?;
        let fetched_at = crate::clock::now();
        let mut findings = Findings::default();
        let mut checked = vec!["driver".to_owned(), "driver_role".to_owned()];
        let role = driver(&self.aws, &region, cluster, &mut findings).await?;
        let policies = match &role {
            Some(role) => Some(role_policies(&self.aws, &region, role).await?),
            None => None,
        };
        let client = kubernetes::connect(&self.aws, &region, cluster).await?;

        // Two volumes with one handle are mounted as one: whichever mounted first wins.
        let volumes = Api::<PersistentVolume>::all(client.clone());
        let mut by_handle: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut by_name = BTreeMap::new();
        kubernetes::each_listed(&volumes, ListParams::default(), |pv| {
            let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) else {
                return;
            };
            if csi.driver != DRIVER && csi.driver != super::fsx::DRIVER {
                return;
            }
            let name = pv.metadata.name.clone().unwrap_or_default();
            by_handle
                .entry(format!("{} of {}", csi.volume_handle, csi.driver))
                .or_default()
                .push(name.clone());
            by_name.insert(name, pv);
        })
        .await?;
        checked.push("volume_handles".to_owned());
        for (handle, names) in by_handle.iter().filter(|(_, n)| n.len() > 1) {
            findings.add(
                None,
                "volume_handles",
                true,
                format!(
                    "volumes {} share the volume handle {handle}: a node mounts whichever came first for all of them",
                    names.join(", ")
                ),
                Some(format!("kubectl delete pv {}", names[1..].join(" "))),
            );
        }

        let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NAMESPACE);
        let mut labelled = Vec::new();
        kubernetes::each_listed(&claims, ListParams::default().labels(STORAGE_LABEL), |c| {
            labelled.push(c)
        })
        .await?;
        let s3 = self.aws.s3(&region);
        for claim in labelled {
            let storage = claim.metadata.name.clone().unwrap_or_default();
            let at = Some(storage.as_str());
            let fsx = claim
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(STORAGE_LABEL))
                == Some(&"fsx".to_owned());
            checked.push(if fsx {
                format!(
                    "{storage}: claim_bound, fsx_driver, file_system_available, volume_attributes, lustre_ports, lustre_client"
                )
            } else {
                format!(
                    "{storage}: claim_bound, bucket_exists, bucket_region, driver_access, bucket_policy"
                )
            });
            let phase = claim
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_else(|| "Pending".to_owned());
            if phase != "Bound" {
                findings.add(
                    at,
                    "claim_bound",
                    true,
                    format!("claim {NAMESPACE}/{storage} is {phase}: pods that mount it wait"),
                    Some(format!("kubectl describe pvc -n {NAMESPACE} {storage}")),
                );
            }
            let volume = claim
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.as_ref())
                .and_then(|v| by_name.get(v));
            let Some(volume) = volume else {
                continue;
            };
            let spec = volume.spec.clone().unwrap_or_default();
            if spec
                .csi
                .as_ref()
                .is_some_and(|c| c.driver == super::fsx::DRIVER)
            {
                super::fsx::check(&self.aws, &region, cluster, &storage, volume, &mut findings)
                    .await?;
                continue;
            }
            let Some(bucket) = spec
                .csi
                .as_ref()
                .and_then(|c| c.volume_attributes.as_ref())
                .and_then(|a| a.get("bucketName").cloned())
            else {
                continue;
            };
            // A bucket in another region answers HeadBucket with a redirect and one of
            // another account with 403: findings too, not a failed check.
            let exists = match s3
                .head_bucket()
                .bucket(&bucket)
                .send()
                .await
                .found("s3", "HeadBucket")
            {
                Ok(found) => found.is_some(),
                Err(e) => {
                    findings.add(
                        at,
                        "bucket_access",
                        true,
                        format!("hypd cannot read bucket {bucket} from {region}: {e}"),
                        Some(format!("aws s3api get-bucket-location --bucket {bucket}")),
                    );
                    continue;
                }
            };
            if !exists {
                findings.add(
                    at,
                    "bucket_exists",
                    true,
                    format!("bucket {bucket} does not exist"),
                    Some(format!("aws s3 mb s3://{bucket} --region {region}")),
                );
                continue;
            }
            let location = match s3
                .get_bucket_location()
                .bucket(&bucket)
                .send()
                .await
                .upstream("s3", "GetBucketLocation")
            {
                Ok(l) => l,
                Err(e) => {
                    findings.add(
                        at,
                        "bucket_region",
                        false,
                        format!("the region of bucket {bucket} could not be read: {e}"),
                        None,
                    );
                    continue;
                }
            };
            // S3 answers no constraint for us-east-1.
            let bucket_region = location
                .location_constraint()
                .map(|l| l.as_str().to_owned())
                .filter(|l| !l.is_empty())
                .unwrap_or_else(|| "us-east-1".to_owned());
            let mounted_region = spec
                .mount_options
                .iter()
                .flatten()
                .find_map(|o| o.strip_prefix("region ").map(str::to_owned));
            if let Some(mounted) = mounted_region.filter(|m| *m != bucket_region) {
                findings.add(
                    at,
                    "bucket_region",
                    true,
                    format!("bucket {bucket} is in {bucket_region}, but its volume mounts it in {mounted}"),
                    Some(format!("delete_storage {storage}, then create_s3_storage again with bucket {bucket}")),
                );
            }
            if let (Some(role), Some((inline, managed))) = (&role, &policies) {
                let needed = s3_csi_inline_policy(&bucket);
                let (read, list) = (
                    allows(inline, "s3:GetObject", &format!("arn:aws:s3:::{bucket}/x")),
                    allows(inline, "s3:ListBucket", &format!("arn:aws:s3:::{bucket}")),
                );
                if !(read && list) {
                    // Attached managed policies are not read: a role with some may
                    // still be allowed, which hypd cannot confirm.
                    let attached = !managed.is_empty();
                    findings.add(
                        at,
                        "driver_access",
                        !attached,
                        format!(
                            "the driver's role {role} {} s3:ListBucket on {bucket} and s3:GetObject in it{}",
                            if attached { "may not allow" } else { "does not allow" },
                            if attached {
                                format!(" (its managed policies {} were not read)", managed.join(", "))
                            } else {
                                String::new()
                            }
                        ),
                        Some(format!(
                            "aws iam put-role-policy --role-name {role} --policy-name hypd-s3-csi-{storage} --policy-document '{needed}'"
                        )),
                    );
                }
            }
            let policy = s3
                .get_bucket_policy()
                .bucket(&bucket)
                .send()
                .await
                .allowing("s3", "GetBucketPolicy", &["NoSuchBucketPolicy"])?
                .and_then(|p| p.policy().map(document));
            if let Some(policy) = policy
                && denies(&policy, role.as_deref(), &bucket)
            {
                findings.add(
                    at,
                    "bucket_policy",
                    true,
                    format!("bucket {bucket}'s policy denies reading it to the driver's role"),
                    Some(format!(
                        "aws s3api get-bucket-policy --bucket {bucket}  # then remove the Deny"
                    )),
                );
            }
        }
        Ok(StorageCheck {
            name: cluster.to_owned(),
            checked,
            findings: findings.0,
            fetched_at,
        })
    }
}

/// A role's inline policy documents, and the ARNs of its attached managed policies, as
/// the role resource reads them (none for a role that does not exist).
async fn role_policies(
    aws: &Aws,
    region: &str,
    role: &str,
) -> Result<(Vec<Value>, Vec<String>), ApiError> {
    let found = Role {
        iam: aws.iam(region),
        // Only read: whose it is does not matter here.
        cluster: String::new(),
        name: role.to_owned(),
        want: Want::Absent,
    }
    .observe()
    .await?;
    Ok((found.inline.into_values().collect(), found.attached))
}

/// A statement's `Action`/`Resource` (or `Principal.AWS`) as a list.
fn strings(v: &Value) -> Vec<&str> {
    match v {
        Value::String(s) => vec![s.as_str()],
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// IAM's wildcards: `*` any run of characters, `?` one.
fn matches(pattern: &str, value: &str) -> bool {
    let (p, v): (Vec<char>, Vec<char>) = (pattern.chars().collect(), value.chars().collect());
    let (mut pi, mut vi, mut star, mut mark) = (0, 0, None, 0);
    while vi < v.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == v[vi]) {
            pi += 1;
            vi += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = vi;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            vi = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

fn statements(doc: &Value) -> Vec<&Value> {
    match &doc["Statement"] {
        Value::Array(a) => a.iter().collect(),
        s @ Value::Object(_) => vec![s],
        _ => Vec::new(),
    }
}

/// Whether a statement names `action` on `resource` (actions compare without case).
fn covers(statement: &Value, action: &str, resource: &str) -> bool {
    let action = action.to_ascii_lowercase();
    strings(&statement["Action"])
        .iter()
        .any(|a| matches(&a.to_ascii_lowercase(), &action))
        && strings(&statement["Resource"])
            .iter()
            .any(|r| matches(r, resource))
}

/// Whether `docs` allow `action` on `resource`: an Allow names it and no Deny does.
/// Conditions are not evaluated: a conditional Allow counts, a conditional Deny too.
pub fn allows(docs: &[Value], action: &str, resource: &str) -> bool {
    let all: Vec<&Value> = docs.iter().flat_map(statements).collect();
    let with = |effect: &str| {
        all.iter()
            .any(|s| s["Effect"] == effect && covers(s, action, resource))
    };
    with("Allow") && !with("Deny")
}

/// Whether a bucket policy denies reading or listing `bucket` to everyone or to `role`
/// (by name in its ARN), without a condition that could exempt it.
fn denies(policy: &Value, role: Option<&str>, bucket: &str) -> bool {
    statements(policy).into_iter().any(|s| {
        let principal = &s["Principal"];
        let everyone = principal == "*" || strings(&principal["AWS"]).contains(&"*");
        let named = role.is_some_and(|r| {
            strings(&principal["AWS"])
                .iter()
                .any(|p| p.ends_with(&format!(":role/{r}")))
        });
        s["Effect"] == "Deny"
            && s.get("Condition").is_none()
            && (everyone || named)
            && (covers(s, "s3:GetObject", &format!("arn:aws:s3:::{bucket}/x"))
                || covers(s, "s3:ListBucket", &format!("arn:aws:s3:::{bucket}")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_driver_policy_hypd_writes_allows_its_bucket_only() {
        let docs = [s3_csi_inline_policy("data")];
        assert!(allows(&docs, "s3:GetObject", "arn:aws:s3:::data/x"));
        assert!(allows(&docs, "s3:ListBucket", "arn:aws:s3:::data"));
        assert!(!allows(&docs, "s3:GetObject", "arn:aws:s3:::other/x"));
        let wide = [json!({"Statement": {"Effect": "Allow", "Action": "s3:*", "Resource": "*"}})];
        assert!(allows(&wide, "S3:GetObject", "arn:aws:s3:::other/x"));
        let denied = [
            wide[0].clone(),
            json!({"Statement": [{"Effect": "Deny", "Action": ["s3:Get*"], "Resource": "arn:aws:s3:::other/*"}]}),
        ];
        assert!(!allows(&denied, "s3:GetObject", "arn:aws:s3:::other/x"));
        assert!(matches("arn:aws:s3:::da?a/*", "arn:aws:s3:::data/a/b"));
        assert!(!matches("arn:aws:s3:::data", "arn:aws:s3:::data2"));
    }

    #[test]
    fn a_bucket_policy_denying_everyone_is_found() {
        let deny = json!({"Statement": [{"Effect": "Deny", "Principal": "*", "Action": "s3:*",
                                         "Resource": ["arn:aws:s3:::data", "arn:aws:s3:::data/*"]}]});
        assert!(denies(&deny, Some("hypd-ml-1-s3csi"), "data"));
        let conditional = json!({"Statement": [{"Effect": "Deny", "Principal": "*", "Action": "s3:*",
            "Resource": "arn:aws:s3:::data/*", "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]});
        assert!(!denies(&conditional, Some("hypd-ml-1-s3csi"), "data"));
        let to_role = json!({"Statement": {"Effect": "Deny",
            "Principal": {"AWS": "arn:aws:iam::123456789012:role/hypd-ml-1-s3csi"},
            "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::data"}});
        assert!(denies(&to_role, Some("hypd-ml-1-s3csi"), "data"));
        assert!(!denies(&to_role, Some("someone-else"), "data"));
    }
}
