//! Values that reject bad input while deserializing ("parse, don't validate"): once a
//! request holds a `ClusterName`, it is a valid one, whichever face it came through. The
//! rules are AWS's own; the messages say what is accepted, and the JSON Schemas carry the
//! same limits so agents and forms see them before sending.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A string newtype with one parse rule, a schema and the usual conversions.
macro_rules! string_value {
    (
        $(#[$doc:meta])*
        $name:ident, $parse:ident, schema: $schema:tt
    ) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(String);

        impl $name {
            /// Checks `s` against the rule; the error says what is accepted.
            pub fn parse(s: &str) -> Result<Self, String> {
                $parse(s).map(|()| Self(s.to_owned()))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                Self::parse(s)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = Cow::<'de, str>::deserialize(d)?;
                Self::parse(&s).map_err(serde::de::Error::custom)
            }
        }

        impl JsonSchema for $name {
            fn schema_name() -> Cow<'static, str> {
                stringify!($name).into()
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!($schema)
            }
        }
    };
}

/// How much of a rejected value an error quotes. Errors are echoed by every face (and
/// into the audit log), so a megabyte-long value must not come back as a megabyte-long
/// error: the quote is cut and says how long the value was.
pub const SHOWN_CHARS: usize = 64;

/// `s` quoted for an error message, cut to [`SHOWN_CHARS`] characters.
pub fn shown(s: &str) -> String {
    match s.char_indices().nth(SHOWN_CHARS) {
        None => format!("{s:?}"),
        Some((cut, _)) => format!("{:?}… ({} characters)", &s[..cut], s.chars().count()),
    }
}

fn is_alnum(c: char) -> bool {
    c.is_ascii_alphanumeric()
}

/// HyperPod's name rule (`^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$`), which also satisfies EKS's.
fn check_hyperpod_style(s: &str, what: &str) -> Result<(), String> {
    let ok = (1..=63).contains(&s.len())
        && s.chars().all(|c| is_alnum(c) || c == '-')
        && s.chars().next().is_some_and(is_alnum)
        && s.chars().last().is_some_and(is_alnum);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{what} must be 1-63 characters of letters, digits and hyphens, starting and ending with a letter or digit (got {})",
            shown(s)
        ))
    }
}

fn check_cluster_name(s: &str) -> Result<(), String> {
    check_hyperpod_style(s, "a cluster name")
}

fn check_instance_group_name(s: &str) -> Result<(), String> {
    check_hyperpod_style(s, "an instance group name")
}

/// EKS: 1-100 characters, `^[0-9A-Za-z][A-Za-z0-9\-_]*$`.
fn check_eks_cluster_name(s: &str) -> Result<(), String> {
    let ok = (1..=100).contains(&s.len())
        && s.chars().next().is_some_and(is_alnum)
        && s.chars().all(|c| is_alnum(c) || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "an EKS cluster name must be 1-100 characters of letters, digits, hyphens and underscores, starting with a letter or digit (got {})",
            shown(s)
        ))
    }
}

/// Splits `us-east-1`-like names: partition-prefixed geography, a direction, a number.
fn region_parts(s: &str) -> Option<()> {
    let mut parts: Vec<&str> = s.split('-').collect();
    let number = parts.pop()?;
    if number.is_empty() || !number.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let geo = parts.first()?;
    if geo.len() != 2 || !geo.chars().all(|c| c.is_ascii_lowercase()) {
        return None;
    }
    // us-east, us-gov-west, cn-northwest, eu-central, ap-southeast, us-isob-east…
    if !(2..=3).contains(&parts.len())
        || !parts[1..]
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_lowercase()))
    {
        return None;
    }
    Some(())
}

/// Longer than any region AWS has (`ap-southeast-5`, `us-gov-west-1`) with room to grow.
const REGION_MAX: usize = 32;

fn check_region(s: &str) -> Result<(), String> {
    (s.len() <= REGION_MAX)
        .then_some(())
        .and_then(|()| region_parts(s))
        .ok_or_else(|| {
            format!(
                "a region looks like us-east-1 or eu-central-1 (got {})",
                shown(s)
            )
        })
}

/// `us-east-1a`: a region followed by one zone letter.
fn check_az_name(s: &str) -> Result<(), String> {
    let ok = s.len() > 1
        && s.len() <= REGION_MAX + 1
        && s.chars().last().is_some_and(|c| c.is_ascii_lowercase())
        && region_parts(&s[..s.len() - 1]).is_some();
    if ok {
        Ok(())
    } else {
        Err(format!(
            "an Availability Zone name looks like us-east-1a (got {})",
            shown(s)
        ))
    }
}

/// `use1-az1`, `usw2-az4`, `use1-bos1-az1` (Local Zones).
fn check_az_id(s: &str) -> Result<(), String> {
    let ok = s.len() <= 32
        && s.rsplit_once("-az").is_some_and(|(prefix, n)| {
            !prefix.is_empty()
                && prefix
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_lowercase())
                && prefix.split('-').all(|p| {
                    !p.is_empty()
                        && p.chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                })
                && !n.is_empty()
                && n.len() <= 2
                && n.chars().all(|c| c.is_ascii_digit())
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "an Availability Zone id looks like use1-az1 (got {})",
            shown(s)
        ))
    }
}

/// `family.size` with lowercase letters, digits and hyphens, e.g. `p5.48xlarge`,
/// `p6-b200.48xlarge`.
fn check_type_parts(s: &str) -> bool {
    let Some((family, size)) = s.split_once('.') else {
        return false;
    };
    let word = |w: &str| {
        !w.is_empty()
            && w.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    word(family)
        && word(size)
        && !size.contains('.')
        && family
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase())
        && s.len() <= 64
}

fn check_instance_type(s: &str) -> Result<(), String> {
    if check_type_parts(s) {
        Ok(())
    } else {
        Err(format!(
            "an EC2 instance type looks like p5.48xlarge (got {})",
            shown(s)
        ))
    }
}

fn check_ml_instance_type(s: &str) -> Result<(), String> {
    match s.strip_prefix("ml.") {
        Some(rest) if check_type_parts(rest) => Ok(()),
        _ => Err(format!(
            "a HyperPod instance type looks like ml.p5.48xlarge (got {})",
            shown(s)
        )),
    }
}

/// `arn:PARTITION:SERVICE:REGION:ACCOUNT:RESOURCE`.
fn check_arn(s: &str) -> Result<(), String> {
    let parts: Vec<&str> = s.splitn(6, ':').collect();
    let ok = parts.len() == 6
        && parts[0] == "arn"
        && matches!(parts[1], "aws" | "aws-cn" | "aws-us-gov")
        && !parts[2].is_empty()
        && (parts[4].is_empty()
            || (parts[4].len() == 12 && parts[4].chars().all(|c| c.is_ascii_digit())))
        && !parts[5].is_empty()
        && s.len() <= 2048;
    if ok {
        Ok(())
    } else {
        Err(format!(
            "an ARN looks like arn:aws:SERVICE:REGION:ACCOUNT:RESOURCE (got {})",
            shown(s)
        ))
    }
}

/// `s` has a length in `len` and only ASCII letters, digits and the `extra` characters.
fn letters_digits_and(s: &str, len: std::ops::RangeInclusive<usize>, extra: &[char]) -> bool {
    len.contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || extra.contains(&c))
}

fn check_training_plan_arn(s: &str) -> Result<(), String> {
    check_arn(s)?;
    let parts: Vec<&str> = s.splitn(6, ':').collect();
    if parts[2] == "sagemaker" && parts[5].starts_with("training-plan/") {
        Ok(())
    } else {
        Err(format!(
            "a training plan ARN looks like arn:aws:sagemaker:REGION:ACCOUNT:training-plan/NAME (got {})",
            shown(s)
        ))
    }
}

fn check_token_name(s: &str) -> Result<(), String> {
    let ok = letters_digits_and(s, 1..=64, &['-', '_', '.']);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "a token name must be 1-64 characters of letters, digits, '-', '_' and '.' (got {})",
            shown(s)
        ))
    }
}

fn check_idempotency_key(s: &str) -> Result<(), String> {
    let ok = letters_digits_and(s, 8..=128, &['-', '_', '.', ':']);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "an idempotency key must be 8-128 characters of letters, digits, '-', '_', '.' and ':' (got {})",
            shown(s)
        ))
    }
}

string_value!(
    /// A caller-chosen key that makes a mutation safe to send again: a request with a key
    /// already used returns that operation instead of starting another.
    IdempotencyKey, check_idempotency_key,
    schema: { "type": "string", "minLength": 8, "maxLength": 128, "pattern": "^[A-Za-z0-9._:-]+$",
              "description": "The same key when re-sending a request" }
);
/// The prefix of every confirmation hypd issues.
pub const CONFIRMATION_PREFIX: &str = "hypd_confirm_";

fn check_confirmation(s: &str) -> Result<(), String> {
    let body = s.strip_prefix(CONFIRMATION_PREFIX).unwrap_or("");
    if body.len() == 64 && body.chars().all(|c| c.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(format!(
            "a confirmation is the value a first call without one returned (hypd_confirm_ and 64 hex digits; got {})",
            shown(s)
        ))
    }
}

string_value!(
    /// What a destructive command's first call returns with its plan: sent back on the
    /// second call, it runs exactly the planned request, once.
    Confirmation, check_confirmation,
    schema: { "type": "string", "minLength": 77, "maxLength": 77, "pattern": "^hypd_confirm_[0-9a-f]{64}$",
              "description": "The confirmation the same call without one returned (single use, 5 minutes)" }
);
string_value!(
    /// A hypd cluster name: used as both the EKS and the HyperPod cluster name, so it
    /// follows the stricter HyperPod rule.
    ClusterName, check_cluster_name,
    schema: { "type": "string", "minLength": 1, "maxLength": 63, "pattern": "^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$",
              "description": "Cluster name: letters, digits and hyphens, starting and ending with a letter or digit" }
);
string_value!(
    /// An existing EKS cluster's name (EKS allows underscores and up to 100 characters).
    EksClusterName, check_eks_cluster_name,
    schema: { "type": "string", "minLength": 1, "maxLength": 100, "pattern": "^[0-9A-Za-z][A-Za-z0-9\\-_]*$" }
);
string_value!(
    /// A HyperPod instance group name.
    InstanceGroupName, check_instance_group_name,
    schema: { "type": "string", "minLength": 1, "maxLength": 63, "pattern": "^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$" }
);
string_value!(
    /// An AWS region such as `us-east-1`.
    Region, check_region,
    schema: { "type": "string", "maxLength": 32, "pattern": "^[a-z]{2}(-[a-z]+){1,2}-[0-9]+$", "examples": ["us-east-1"] }
);
string_value!(
    /// An Availability Zone name such as `us-east-1a` (differs between accounts).
    AzName, check_az_name,
    schema: { "type": "string", "maxLength": 33, "pattern": "^[a-z]{2}(-[a-z]+){1,2}-[0-9]+[a-z]$", "examples": ["us-east-1a"] }
);
string_value!(
    /// An Availability Zone id such as `use1-az1` (the same in every account).
    AzId, check_az_id,
    schema: { "type": "string", "maxLength": 32, "pattern": "^[a-z][a-z0-9]*(-[a-z0-9]+)*-az[0-9]{1,2}$", "examples": ["use1-az1"] }
);
string_value!(
    /// An EC2 instance type such as `p5.48xlarge`.
    InstanceType, check_instance_type,
    schema: { "type": "string", "maxLength": 64, "pattern": "^[a-z][a-z0-9-]*\\.[a-z0-9-]+$", "examples": ["p5.48xlarge"] }
);
string_value!(
    /// A HyperPod instance type such as `ml.p5.48xlarge`.
    MlInstanceType, check_ml_instance_type,
    schema: { "type": "string", "maxLength": 67, "pattern": "^ml\\.[a-z][a-z0-9-]*\\.[a-z0-9-]+$", "examples": ["ml.p5.48xlarge"] }
);
string_value!(
    /// Any AWS ARN.
    Arn, check_arn,
    schema: { "type": "string", "maxLength": 2048, "pattern": "^arn:(aws|aws-cn|aws-us-gov):[^:]+:[^:]*:([0-9]{12})?:.+$" }
);
string_value!(
    /// A SageMaker training plan ARN (a capacity reservation; it fixes the AZ).
    TrainingPlanArn, check_training_plan_arn,
    schema: { "type": "string", "maxLength": 2048, "pattern": "^arn:(aws|aws-cn|aws-us-gov):sagemaker:[^:]+:[0-9]{12}:training-plan/.+$" }
);
fn check_vpc_id(s: &str) -> Result<(), String> {
    check_resource_id(s, "vpc", "a VPC id looks like vpc-0123456789abcdef0")
}

fn check_resource_id(s: &str, prefix: &str, rule: &str) -> Result<(), String> {
    let ok = s
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('-'))
        .is_some_and(|hex| {
            (8..=17).contains(&hex.len())
                && hex
                    .chars()
                    .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        });
    if ok {
        Ok(())
    } else {
        Err(format!("{rule} (got {})", shown(s)))
    }
}

/// S3's bucket naming rules (general purpose buckets).
fn check_bucket_name(s: &str) -> Result<(), String> {
    let chars_ok = s
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.'));
    let ends_ok = s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric());
    let ip_like = s.split('.').count() == 4 && s.split('.').all(|p| p.parse::<u8>().is_ok());
    if (3..=63).contains(&s.len()) && chars_ok && ends_ok && !s.contains("..") && !ip_like {
        Ok(())
    } else {
        Err(format!(
            "a bucket name is 3-63 characters of lowercase letters, digits, '-' and '.', starting and ending with a letter or digit (got {})",
            shown(s)
        ))
    }
}

fn check_kubernetes_version(s: &str) -> Result<(), String> {
    let ok = s.split_once('.').is_some_and(|(major, minor)| {
        major == "1"
            && !minor.is_empty()
            && minor.len() <= 2
            && minor.chars().all(|c| c.is_ascii_digit())
    });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "a Kubernetes version looks like 1.33 (got {})",
            shown(s)
        ))
    }
}

string_value!(
    /// An existing VPC's id.
    VpcId, check_vpc_id,
    schema: { "type": "string", "maxLength": 21, "pattern": "^vpc-[0-9a-f]{8,17}$", "examples": ["vpc-0123456789abcdef0"] }
);
string_value!(
    /// An S3 bucket name.
    BucketName, check_bucket_name,
    schema: { "type": "string", "minLength": 3, "maxLength": 63, "pattern": "^[a-z0-9][a-z0-9.-]*[a-z0-9]$" }
);
string_value!(
    /// An EKS Kubernetes version, `major.minor`.
    KubernetesVersion, check_kubernetes_version,
    schema: { "type": "string", "maxLength": 4, "pattern": "^1\\.[0-9]{1,2}$", "examples": ["1.33"] }
);
/// A Kubernetes DNS label short enough to name a bucket after it with the cluster's name.
fn check_storage_name(s: &str) -> Result<(), String> {
    let ok = (1..=40).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "a storage name is 1-40 characters of lowercase letters, digits and '-', starting with a letter and ending with a letter or digit (got {})",
            shown(s)
        ))
    }
}

/// Where pods must not mount storage: the system's own directories, and `/s3`, which is
/// the cluster's shared bucket in every pod.
const RESERVED_MOUNTS: &[&str] = &[
    "/s3",
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/hypd-scratch",
    "/lib",
    "/lib64",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/sys",
    "/tmp",
    "/usr",
    "/var",
];

fn check_mount_path(s: &str) -> Result<(), String> {
    let segments: Vec<&str> = s.strip_prefix('/').unwrap_or("").split('/').collect();
    let shape = (2..=128).contains(&s.len())
        && s.starts_with('/')
        && segments.iter().all(|seg| {
            !seg.is_empty()
                && *seg != "."
                && *seg != ".."
                && seg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        });
    if !shape {
        return Err(format!(
            "a mount path is an absolute path of 2-128 characters, its parts letters, digits, '-', '_' and '.' (no '.' or '..' parts, no trailing '/'), e.g. /mnt/data (got {})",
            shown(s)
        ));
    }
    match RESERVED_MOUNTS
        .iter()
        .find(|r| s == **r || s.starts_with(&format!("{r}/")))
    {
        Some(r) => Err(format!(
            "{r} is reserved ({}); choose e.g. /mnt/data",
            if *r == "/s3" {
                "the cluster's shared bucket is mounted there"
            } else {
                "a system directory"
            }
        )),
        None => Ok(()),
    }
}

string_value!(
    /// A storage's name: the PersistentVolumeClaim workloads mount.
    StorageName, check_storage_name,
    schema: { "type": "string", "minLength": 1, "maxLength": 40, "pattern": "^[a-z]([a-z0-9-]*[a-z0-9])?$" }
);
string_value!(
    /// Where pods mount a storage (absolute; not /s3 or a system directory).
    MountPath, check_mount_path,
    schema: { "type": "string", "minLength": 2, "maxLength": 128, "pattern": "^(/[A-Za-z0-9._-]+)+$", "examples": ["/mnt/data"] }
);
fn check_model_id(s: &str) -> Result<(), String> {
    let part = |p: &str| {
        (1..=96).contains(&p.len())
            && p.starts_with(|c: char| c.is_ascii_alphanumeric())
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
            && !p.contains("--")
            && !p.contains("..")
            && !p.ends_with('.')
    };
    match s.split_once('/') {
        Some((org, name)) if part(org) && part(name) => Ok(()),
        _ => Err(format!(
            "a model id is <organisation>/<name> as on the Hugging Face hub, e.g. meta-llama/Llama-3.2-1B: letters, digits, '.', '_' and '-', no '--' or '..' (got {})",
            shown(s)
        )),
    }
}

fn check_revision(s: &str) -> Result<(), String> {
    let ok = (1..=128).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'))
        && !s.contains("..")
        && !s.starts_with(['/', '-', '.'])
        && !s.ends_with('/');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "a revision is a branch, tag or commit of the model's repository, e.g. main, v1.0 or a 40-hex commit (got {})",
            shown(s)
        ))
    }
}

fn check_secret_name(s: &str) -> Result<(), String> {
    let ok = (1..=63).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        // Never the value: a token pasted into this field must not come back.
        Err(format!(
            "a Secret name is 1-63 lowercase letters, digits and '-'; the value given ({} characters) is not one",
            s.chars().count()
        ))
    }
}

string_value!(
    /// A Hugging Face model repository, `<organisation>/<name>`.
    HfModelId, check_model_id,
    schema: { "type": "string", "maxLength": 193, "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$", "examples": ["meta-llama/Llama-3.2-1B"] }
);
string_value!(
    /// A branch, tag or commit of a model repository.
    HfRevision, check_revision,
    schema: { "type": "string", "maxLength": 128, "pattern": "^[A-Za-z0-9_][A-Za-z0-9._/-]*$" }
);
string_value!(
    /// A Kubernetes Secret in namespace `default`.
    SecretName, check_secret_name,
    schema: { "type": "string", "maxLength": 63, "pattern": "^[a-z0-9]([a-z0-9-]*[a-z0-9])?$" }
);
string_value!(
    /// A name for an API token, to recognise it in lists and the audit log.
    TokenName, check_token_name,
    schema: { "type": "string", "minLength": 1, "maxLength": 64, "pattern": "^[A-Za-z0-9._-]+$" }
);

/// EC2's instance id rule, which HyperPod node ids follow: `i-` and 8 or 17 lowercase hex
/// digits.
fn check_node_id(s: &str) -> Result<(), String> {
    let ok = s.strip_prefix("i-").is_some_and(|hex| {
        matches!(hex.len(), 8 | 17)
            && hex
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "a node id is its EC2 instance id: i- and 8 or 17 lowercase hex digits, e.g. i-0123456789abcdef0 (got {})",
            shown(s)
        ))
    }
}

string_value!(
    /// A HyperPod node, by its EC2 instance id.
    NodeId, check_node_id,
    schema: { "type": "string", "maxLength": 19, "pattern": "^i-[0-9a-f]{8}([0-9a-f]{9})?$" }
);

fn check_operation_id(s: &str) -> Result<(), String> {
    let ok = letters_digits_and(s, 1..=128, &['-', '_', '.', ':']);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "an operation id is 1-128 characters of letters, digits, '-', '_', '.' and ':', e.g. op-0196f0c1a2b3… (got {})",
            shown(s)
        ))
    }
}

fn check_operation_target(s: &str) -> Result<(), String> {
    let ok = letters_digits_and(s, 1..=200, &['-', '_', '.', ':', '/']);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "an operation target is 1-200 characters of letters, digits, '-', '_', '.', ':' and '/', e.g. cluster/ml-1 (got {})",
            shown(s)
        ))
    }
}

string_value!(
    /// An operation's id, as `get_operation` and every mutation return it.
    OperationId, check_operation_id,
    schema: { "type": "string", "minLength": 1, "maxLength": 128, "pattern": "^[A-Za-z0-9._:-]+$" }
);
string_value!(
    /// What an operation acts on, e.g. `cluster/ml-1`.
    OperationTarget, check_operation_target,
    schema: { "type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[A-Za-z0-9._:/-]+$" }
);

/// For request fields kept as `String` (pages build them from strings): decoded through
/// the newtype `V`, so the rule and its message are the newtype's.
pub fn checked<'de, D, V>(d: D) -> Result<String, D::Error>
where
    D: Deserializer<'de>,
    V: Deserialize<'de> + AsRef<str>,
{
    V::deserialize(d).map(|v| v.as_ref().to_owned())
}

/// As [`checked`], for an optional field.
pub fn checked_opt<'de, D, V>(d: D) -> Result<Option<String>, D::Error>
where
    D: Deserializer<'de>,
    V: Deserialize<'de> + AsRef<str>,
{
    Option::<V>::deserialize(d).map(|v| v.map(|v| v.as_ref().to_owned()))
}

/// At most `N` items: a filter list never needs more, and an unbounded one is a way to
/// make one request cost a lot.
pub fn at_most<'de, D, T, const N: usize>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    let items = Vec::<T>::deserialize(d)?;
    if items.len() > N {
        return Err(serde::de::Error::custom(format!(
            "at most {N} items (got {})",
            items.len()
        )));
    }
    Ok(items)
}

/// An IPv4 CIDR block, host bits zero, with a prefix VPCs accept (/16 to /28).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cidr {
    addr: u32,
    prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Result<Self, String> {
        let err = || {
            format!(
                "a CIDR block looks like 10.0.0.0/16, with a prefix from /16 to /28 (got {})",
                shown(s)
            )
        };
        let (ip, prefix) = s.split_once('/').ok_or_else(err)?;
        let ip: std::net::Ipv4Addr = ip.parse().map_err(|_| err())?;
        let prefix: u8 = prefix.parse().map_err(|_| err())?;
        if !(16..=28).contains(&prefix) {
            return Err(err());
        }
        let addr = u32::from(ip);
        let mask = u32::MAX << (32 - prefix);
        if addr & !mask != 0 {
            return Err(format!(
                "{s:?} has host bits set: the network address is {}/{prefix}",
                std::net::Ipv4Addr::from(addr & mask)
            ));
        }
        Ok(Self { addr, prefix })
    }

    /// The block of `prefix` bits at `network`, if the address is that block's first
    /// and the prefix one VPCs accept.
    pub fn new(network: std::net::Ipv4Addr, prefix: u8) -> Result<Self, String> {
        Self::parse(&format!("{network}/{prefix}"))
    }

    pub fn prefix(self) -> u8 {
        self.prefix
    }

    /// True when `other` lies entirely inside this block.
    pub fn contains(self, other: Cidr) -> bool {
        let (a0, a1) = self.range();
        let (b0, b1) = other.range();
        a0 <= b0 && b1 <= a1
    }

    pub fn network(self) -> std::net::Ipv4Addr {
        self.addr.into()
    }

    /// First and last address of the block.
    pub fn range(self) -> (u32, u32) {
        let size = 1u64 << (32 - self.prefix);
        (self.addr, (u64::from(self.addr) + size - 1) as u32)
    }

    pub fn overlaps(self, other: Cidr) -> bool {
        let (a0, a1) = self.range();
        let (b0, b1) = other.range();
        a0 <= b1 && b0 <= a1
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", std::net::Ipv4Addr::from(self.addr), self.prefix)
    }
}

impl Serialize for Cidr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = Cow::<'de, str>::deserialize(d)?;
        Cidr::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Cidr {
    fn schema_name() -> Cow<'static, str> {
        "Cidr".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "maxLength": 18,
            "pattern": "^([0-9]{1,3}\\.){3}[0-9]{1,3}/(1[6-9]|2[0-8])$",
            "examples": ["10.0.0.0/16"]
        })
    }
}

/// A bounded integer newtype (counts, sizes, timeouts).
///
/// Every wrong value gets the same message, whatever JSON type it came as: REST coerces
/// query text to a JSON number, MCP and the console send JSON, so `301`, `1e9`, `2.5`
/// and `"ten"` read alike on every face and the message always states the range.
macro_rules! bounded_int {
    ($(#[$doc:meta])* $name:ident, $min:expr, $max:expr, $what:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
        #[serde(transparent)]
        pub struct $name(u32);

        impl $name {
            pub const MIN: u32 = $min;
            pub const MAX: u32 = $max;

            pub fn new(n: u32) -> Result<Self, String> {
                if ($min..=$max).contains(&n) {
                    Ok(Self(n))
                } else {
                    Err(Self::rule(n))
                }
            }

            pub fn get(self) -> u32 {
                self.0
            }

            /// The one message for a value out of range or of the wrong kind.
            fn rule(got: impl fmt::Display) -> String {
                format!("{} must be an integer from {} to {} (got {got})", $what, $min, $max)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct Visit;
                impl<'de> serde::de::Visitor<'de> for Visit {
                    type Value = $name;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        write!(f, "an integer from {} to {}", $min, $max)
                    }
                    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<$name, E> {
                        u32::try_from(n)
                            .map_err(|_| $name::rule(n))
                            .and_then($name::new)
                            .map_err(E::custom)
                    }
                    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<$name, E> {
                        u32::try_from(n)
                            .map_err(|_| $name::rule(n))
                            .and_then($name::new)
                            .map_err(E::custom)
                    }
                    fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<$name, E> {
                        if n.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(&n) {
                            self.visit_u64(n as u64)
                        } else {
                            Err(E::custom($name::rule(n)))
                        }
                    }
                    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<$name, E> {
                        Err(E::custom($name::rule(shown(s))))
                    }
                    fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<$name, E> {
                        Err(E::custom($name::rule(b)))
                    }
                    fn visit_unit<E: serde::de::Error>(self) -> Result<$name, E> {
                        Err(E::custom($name::rule("null")))
                    }
                    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, _: A) -> Result<$name, A::Error> {
                        Err(serde::de::Error::custom($name::rule("an array")))
                    }
                    fn visit_map<A: serde::de::MapAccess<'de>>(self, _: A) -> Result<$name, A::Error> {
                        Err(serde::de::Error::custom($name::rule("an object")))
                    }
                }
                d.deserialize_any(Visit)
            }
        }

        impl JsonSchema for $name {
            fn schema_name() -> Cow<'static, str> {
                stringify!($name).into()
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!({ "type": "integer", "minimum": $min, "maximum": $max })
            }
        }
    };
}

bounded_int!(
    /// Instances in a group (HyperPod allows up to 2,000 per cluster-level quota; 0 is for
    /// groups that autoscale from zero).
    InstanceCount, 0, 2000, "an instance count"
);
bounded_int!(
    /// EBS volume size per instance in GB.
    VolumeSizeGb, 1, 16384, "a volume size in GB"
);
bounded_int!(
    /// Hardware threads per CPU core: 1 turns hyperthreading off, 2 keeps it.
    ThreadsPerCore, 1, 2, "threads per core"
);
bounded_int!(
    /// Items in one page of a list.
    PageSize, 1, 500, "a page size"
);
bounded_int!(
    /// Seconds a long-poll may wait.
    WaitSeconds, 0, 300, "a wait in seconds"
);

fn check_job_name(s: &str) -> Result<(), String> {
    let ok = (1..=40).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "a job name is 1-40 characters of lowercase letters, digits and '-', starting with a letter and ending with a letter or digit (its pods add a suffix within Kubernetes' 63) (got {})",
            shown(s)
        ))
    }
}

string_value!(
    /// A training job's name: its Kubernetes object's, in namespace `default`.
    JobName, check_job_name,
    schema: { "type": "string", "minLength": 1, "maxLength": 40, "pattern": "^[a-z]([a-z0-9-]*[a-z0-9])?$", "examples": ["llama-sft-1"] }
);

fn check_pod_path(s: &str) -> Result<(), String> {
    let ok = (5..=512).contains(&s.len())
        && s.starts_with("/s3/")
        && !s.ends_with('/')
        && s.split('/').skip(1).all(|part| {
            !part.is_empty()
                && part != "."
                && part != ".."
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+' | '='))
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "a file in the shared bucket as pods see it: /s3/<key>, letters, digits and . _ - + = between slashes, no '..' (got {})",
            shown(s)
        ))
    }
}

string_value!(
    /// A file of the shared bucket as every pod sees it (`/s3/<key>`): the one data
    /// contract between the storage browser and the jobs.
    PodPath, check_pod_path,
    schema: { "type": "string", "minLength": 5, "maxLength": 512, "pattern": "^/s3(/[A-Za-z0-9._+=-]+)+$", "examples": ["/s3/scripts/train.py"] }
);

impl PodPath {
    /// The object key in the shared bucket.
    pub fn key(&self) -> &str {
        &self.0["/s3/".len()..]
    }
}

fn check_image(s: &str) -> Result<(), String> {
    let ok = (1..=255).contains(&s.len())
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.chars().all(|c| {
            c.is_ascii_lowercase()
                || c.is_ascii_digit()
                || matches!(c, '.' | '_' | '-' | '/' | ':' | '@')
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "a container image reference is 1-255 lowercase letters, digits and . _ - / : @ (registry/repository:tag or @sha256:…) (got {})",
            shown(s)
        ))
    }
}

string_value!(
    /// A container image, e.g. `763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.7.1-gpu-py312`.
    ContainerImage, check_image,
    schema: { "type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[a-z0-9][a-z0-9._/:@-]*$" }
);

fn check_rule_name(s: &str) -> Result<(), String> {
    let ok = (1..=63).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "a log rule name is 1-63 letters, digits, '-' and '_' (got {})",
            shown(s)
        ))
    }
}

string_value!(
    /// A log-monitoring rule's name, e.g. `JobHangingDetection`.
    LogRuleName, check_rule_name,
    schema: { "type": "string", "minLength": 1, "maxLength": 63, "pattern": "^[A-Za-z0-9_-]+$" }
);

fn check_pod_name(s: &str) -> Result<(), String> {
    let ok = (1..=253).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "a pod or container name is lowercase letters, digits, '-' and '.', starting and ending with a letter or digit (got {})",
            shown(s)
        ))
    }
}

string_value!(
    /// A Kubernetes pod or container name.
    PodName, check_pod_name,
    schema: { "type": "string", "minLength": 1, "maxLength": 253, "pattern": "^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$" }
);

bounded_int!(
    /// Log lines asked for at once.
    LogLines, 1, 5000, "a number of log lines"
);
bounded_int!(
    /// How far back logs are read, in seconds (up to a week).
    LogSince, 1, 604800, "a time in seconds"
);
bounded_int!(
    /// Nodes (pods, one per node) of a training job.
    NodeCount, 1, 2000, "a node count"
);
bounded_int!(
    /// Training processes per node: at most the GPUs of the instance type.
    ProcessesPerNode, 1, 64, "processes per node"
);
bounded_int!(
    /// How many times a job's pods may be restarted in all.
    RetryCount, 0, 1000, "a retry count"
);
bounded_int!(
    /// Restarts of one kind the operator may make (before a full-job restart, or of the
    /// full job).
    RestartCount, 0, 100, "a restart count"
);
bounded_int!(
    /// The window restarts are counted in, in seconds (a minute to a week).
    EvalPeriodSeconds, 60, 604800, "an evaluation period in seconds"
);
bounded_int!(
    /// Seconds a log rule waits for a line (up to a day).
    LogSeconds, 1, 86400, "a time in seconds"
);
bounded_int!(
    /// Consecutive values a log rule's threshold is judged on.
    DataPoints, 1, 100, "a number of data points"
);

fn check_endpoint_name(s: &str) -> Result<(), String> {
    // The same rule as a job's, for the same reason: the Deployment's pods add a suffix.
    check_job_name(s).map_err(|_| {
        format!(
            "an endpoint name is 1-40 characters of lowercase letters, digits and '-', starting with a letter and ending with a letter or digit (it names the Deployment and the Service) (got {})",
            shown(s)
        )
    })
}

string_value!(
    /// A model endpoint's name: its Deployment's and Service's, in namespace `default`.
    EndpointName, check_endpoint_name,
    schema: { "type": "string", "minLength": 1, "maxLength": 40, "pattern": "^[a-z]([a-z0-9-]*[a-z0-9])?$", "examples": ["qwen-chat"] }
);

fn check_hub_model_id(s: &str) -> Result<(), String> {
    // SageMaker's HubContentName: letters and digits, single words joined by '-'.
    let ok = (1..=63).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "a catalogue model id is 1-63 letters, digits and '-', starting and ending with a letter or digit, as list_jumpstart_models shows it (got {})",
            shown(s)
        ))
    }
}

string_value!(
    /// A model of the SageMaker public hub (JumpStart), e.g. `huggingface-llm-qwen2-5-7b-instruct`.
    HubModelId, check_hub_model_id,
    schema: { "type": "string", "minLength": 1, "maxLength": 63, "pattern": "^[a-zA-Z0-9](-*[a-zA-Z0-9])*$" }
);

fn check_hub_model_version(s: &str) -> Result<(), String> {
    let parts: Vec<&str> = s.split('.').collect();
    let ok = parts.len() == 3
        && parts
            .iter()
            .all(|p| (1..=4).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "a catalogue model version is major.minor.patch, e.g. 1.2.0 (got {})",
            shown(s)
        ))
    }
}

string_value!(
    /// A version of a catalogue model, as the hub numbers them.
    HubModelVersion, check_hub_model_version,
    schema: { "type": "string", "pattern": "^\\d{1,4}\\.\\d{1,4}\\.\\d{1,4}$", "examples": ["1.2.0"] }
);

fn check_redis_url(s: &str) -> Result<(), String> {
    let rest = s
        .strip_prefix("redis://")
        .or_else(|| s.strip_prefix("rediss://"));
    let Some(rest) = rest else {
        return Err(format!(
            "a Redis URL starts with redis:// or rediss:// (got {})",
            shown(s)
        ));
    };
    let host_port = rest.split('/').next().unwrap_or_default();
    if host_port.contains('@') {
        // The URL is written into the InferenceEndpointConfig, which anyone who can read
        // the cluster's objects reads: a password there would be a secret in clear.
        return Err(
            "a Redis URL here carries no user or password (it is stored in the cluster's InferenceEndpointConfig in clear): use a Redis reachable only from the cluster's VPC"
                .into(),
        );
    }
    let (host, port) = match host_port.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (host_port, None),
    };
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-'));
    let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0));
    if s.len() <= 512 && host_ok && port_ok {
        Ok(())
    } else {
        Err(format!(
            "a Redis URL is redis://<host>[:<port>][/<db>] (got {})",
            shown(s)
        ))
    }
}

string_value!(
    /// A Redis the KV cache's second tier is kept in, e.g. `redis://kv.internal:6379`.
    RedisUrl, check_redis_url,
    schema: { "type": "string", "maxLength": 512, "pattern": "^rediss?://[A-Za-z0-9.-]+(:[0-9]+)?(/.*)?$" }
);

/// The words a POSIX shell would make of `line`: single quotes keep everything, double
/// quotes keep all but `\"` and `\\`, a backslash outside quotes keeps the next
/// character. No expansion of any kind: a serve command is run as words, never by a shell.
pub fn shell_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => {
                if let Some(w) = word.take() {
                    words.push(w);
                }
            }
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.push(c),
                        None => return Err("a single quote is never closed".into()),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\')) => w.push(c),
                            Some(c) => {
                                w.push('\\');
                                w.push(c);
                            }
                            None => return Err("a double quote is never closed".into()),
                        },
                        Some(c) => w.push(c),
                        None => return Err("a double quote is never closed".into()),
                    }
                }
            }
            '\\' => match chars.next() {
                Some(c) => word.get_or_insert_with(String::new).push(c),
                None => return Err("the line ends in a lone backslash".into()),
            },
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    Ok(words)
}

fn check_serve_command(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 4096 {
        return Err(format!(
            "a serve command is 1-4096 characters (got {})",
            s.len()
        ));
    }
    if s.chars().any(|c| c != '\t' && c.is_control()) {
        return Err(
            "a serve command is one line: no newlines or control characters (it is run as words, not by a shell)"
                .into(),
        );
    }
    match shell_words(s) {
        Ok(w) if !w.is_empty() => Ok(()),
        Ok(_) => Err("a serve command names a program to run".into()),
        Err(why) => Err(format!(
            "the serve command cannot be split into words: {why}"
        )),
    }
}

string_value!(
    /// The command a model server's container runs, as one shell-like line (quotes kept,
    /// nothing expanded), e.g. `vllm serve /s3/models/Qwen/Qwen2.5-0.5B --max-model-len 4096`.
    ServeCommand, check_serve_command,
    schema: { "type": "string", "minLength": 1, "maxLength": 4096, "examples": ["vllm serve /s3/models/Qwen/Qwen2.5-0.5B"] }
);

impl ServeCommand {
    /// Its words (it parsed, so it splits).
    pub fn words(&self) -> Vec<String> {
        shell_words(&self.0).unwrap_or_default()
    }
}

bounded_int!(
    /// GPUs of one model-server replica (all on one node).
    GpusPerReplica, 1, 16, "GPUs per replica"
);
bounded_int!(
    /// Replicas of a model server (0 scales it to zero).
    ReplicaCount, 0, 64, "a replica count"
);
bounded_int!(
    /// Workers of a model pool moved in one change.
    WorkerCount, 1, 64, "a number of workers"
);
bounded_int!(
    /// Requests in flight at the router that one worker replica is sized for.
    RequestsPerReplica, 1, 10000, "a number of requests in flight per replica"
);
bounded_int!(
    /// Seconds between two looks at the router's metrics.
    PollingSeconds, 1, 3600, "a polling interval in seconds"
);
bounded_int!(
    /// Seconds without load before replicas are taken away.
    CooldownSeconds, 0, 86400, "a cooldown in seconds"
);

fn check_served_name(s: &str) -> Result<(), String> {
    let ok = (1..=20).contains(&s.len())
        && s.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "a pool's model name is 1-20 lowercase letters, digits and '-' (it is a label value and part of its Service's name) (got {})",
            shown(s)
        ))
    }
}

string_value!(
    /// A name a model pool's workers serve (`--served-model-name`, or a LoRA adapter's).
    ServedName, check_served_name,
    schema: { "type": "string", "minLength": 1, "maxLength": 20, "pattern": "^[a-z0-9]([a-z0-9-]*[a-z0-9])?$" }
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_names() {
        assert!(ClusterName::parse("ml-cluster-1").is_ok());
        assert!(ClusterName::parse("a").is_ok());
        assert!(ClusterName::parse(&"a".repeat(63)).is_ok());
        for bad in ["", "-a", "a-", "a_b", "a.b", &"a".repeat(64)] {
            assert!(ClusterName::parse(bad).is_err(), "{bad}");
        }
        assert!(EksClusterName::parse("my_eks-1").is_ok());
        assert!(EksClusterName::parse("_x").is_err());
        assert!(EksClusterName::parse(&"a".repeat(101)).is_err());
    }

    #[test]
    fn regions_and_zones() {
        for ok in [
            "us-east-1",
            "eu-central-1",
            "ap-southeast-2",
            "us-gov-west-1",
            "cn-northwest-1",
        ] {
            assert!(Region::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["us-east", "US-EAST-1", "useast1", "us-east-1a", ""] {
            assert!(Region::parse(bad).is_err(), "{bad}");
        }
        assert!(AzName::parse("us-east-1a").is_ok());
        assert!(AzName::parse("us-east-1").is_err());
        for ok in ["use1-az1", "usw2-az4", "use1-bos1-az1", "apne1-az11"] {
            assert!(AzId::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["use1", "az1", "use1-az", "use1-az123", "USE1-az1"] {
            assert!(AzId::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn instance_types() {
        assert!(InstanceType::parse("p5.48xlarge").is_ok());
        assert!(InstanceType::parse("p6-b200.48xlarge").is_ok());
        assert!(InstanceType::parse("ml.p5.48xlarge").is_err());
        assert!(MlInstanceType::parse("ml.p5.48xlarge").is_ok());
        assert!(MlInstanceType::parse("ml.g6e.48xlarge").is_ok());
        assert!(MlInstanceType::parse("p5.48xlarge").is_err());
    }

    #[test]
    fn arns() {
        assert!(Arn::parse("arn:aws:iam::123456789012:role/x").is_ok());
        assert!(Arn::parse("arn:aws:iam::12345:role/x").is_err());
        assert!(
            TrainingPlanArn::parse(
                "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p5-plan"
            )
            .is_ok()
        );
        assert!(TrainingPlanArn::parse("arn:aws:iam::123456789012:role/x").is_err());
    }

    #[test]
    fn cidrs() {
        let a = Cidr::parse("10.0.0.0/16").unwrap();
        let b = Cidr::parse("10.0.16.0/20").unwrap();
        let c = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(a.overlaps(b) && b.overlaps(a));
        assert!(!a.overlaps(c));
        assert_eq!(b.to_string(), "10.0.16.0/20");
        assert!(
            Cidr::parse("10.0.0.1/16")
                .unwrap_err()
                .contains("10.0.0.0/16")
        );
        assert!(Cidr::parse("10.0.0.0/8").is_err());
        assert!(Cidr::parse("10.0.0.0").is_err());
    }

    #[test]
    fn long_values_are_quoted_short() {
        assert_eq!(shown("ml-1"), "\"ml-1\"");
        let err = ClusterName::parse(&"a".repeat(1 << 20)).unwrap_err();
        assert!(err.len() < 300, "{err}");
        assert!(err.ends_with("… (1048576 characters))"), "{err}");
        assert!(OperationId::parse(&"o".repeat(129)).is_err());
        assert!(OperationId::parse("op-0196f0c1a2b3").is_ok());
        assert!(OperationTarget::parse("cluster/ml-1").is_ok());
        assert!(Region::parse(&"a".repeat(40)).is_err());
    }

    #[test]
    fn integers_have_one_message_whatever_their_json() {
        let message = |v: serde_json::Value| {
            serde_json::from_value::<WaitSeconds>(v)
                .unwrap_err()
                .to_string()
        };
        let rule = "a wait in seconds must be an integer from 0 to 300";
        assert_eq!(message(serde_json::json!(301)), format!("{rule} (got 301)"));
        assert_eq!(message(serde_json::json!(-1)), format!("{rule} (got -1)"));
        assert_eq!(message(serde_json::json!(2.5)), format!("{rule} (got 2.5)"));
        assert_eq!(
            message(serde_json::json!(1e9)),
            format!("{rule} (got 1000000000)")
        );
        assert_eq!(
            message(serde_json::json!(1e20)),
            format!("{rule} (got 100000000000000000000)")
        );
        assert_eq!(
            message(serde_json::json!("ten")),
            format!("{rule} (got \"ten\")")
        );
        assert_eq!(
            message(serde_json::json!(true)),
            format!("{rule} (got true)")
        );
        assert_eq!(
            message(serde_json::json!([])),
            format!("{rule} (got an array)")
        );
        let n: WaitSeconds = serde_json::from_value(serde_json::json!(300.0)).unwrap();
        assert_eq!(n.get(), 300);
    }

    #[test]
    fn serde_rejects_while_deserializing() {
        let err = serde_json::from_str::<ClusterName>("\"bad_name\"").unwrap_err();
        assert!(err.to_string().contains("letters, digits and hyphens"));
        let n: InstanceCount = serde_json::from_str("4").unwrap();
        assert_eq!(n.get(), 4);
        assert!(serde_json::from_str::<InstanceCount>("-1").is_err());
        assert!(serde_json::from_str::<VolumeSizeGb>("0").is_err());
        assert_eq!(
            serde_json::to_string(&Cidr::parse("10.0.0.0/16").unwrap()).unwrap(),
            "\"10.0.0.0/16\""
        );
    }
}

fn check_tracking_server_name(s: &str) -> Result<(), String> {
    // SageMaker's pattern: ^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,255}
    let ok = (1..=256).contains(&s.len())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "a tracking server name is 1-256 letters, digits and '-', starting and ending with a letter or digit (got {})",
            shown(s)
        ))
    }
}

string_value!(
    /// A SageMaker managed MLflow tracking server's name.
    TrackingServerName, check_tracking_server_name,
    schema: { "type": "string", "minLength": 1, "maxLength": 256, "pattern": "^[a-zA-Z0-9](-*[a-zA-Z0-9])*$" }
);

fn check_experiment_name(s: &str) -> Result<(), String> {
    let ok = (1..=256).contains(&s.chars().count()) && !s.chars().any(char::is_control);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "an MLflow experiment name is 1-256 characters without control characters (got {})",
            shown(s)
        ))
    }
}

string_value!(
    /// An MLflow experiment's name, e.g. `llama-sft`.
    ExperimentName, check_experiment_name,
    schema: { "type": "string", "minLength": 1, "maxLength": 256 }
);

fn check_metric_key(s: &str) -> Result<(), String> {
    // MLflow's rule: alphanumerics, underscores, dashes, periods, spaces, slashes, colons.
    let ok = (1..=250).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ' ' | '/' | ':'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "a metric name is 1-250 letters, digits and _ - . / : or spaces, as MLflow allows (got {})",
            shown(s)
        ))
    }
}

string_value!(
    /// An MLflow metric's name, e.g. `loss` or `system/gpu_0_utilization_percentage`.
    MetricKey, check_metric_key,
    schema: { "type": "string", "minLength": 1, "maxLength": 250 }
);

bounded_int!(
    /// Most points of one metric series an answer carries.
    MetricPoints, 10, 5000, "a number of points"
);
