//! Cluster-level settings of CreateCluster and UpdateCluster (NodeRecovery,
//! NodeProvisioningMode, ClusterRole, AutoScaling, TieredStorageConfig), checked
//! together on a copy of the cluster because AWS ties them to each other and to the
//! orchestrator: the copy is kept only if every rule holds.

use serde_json::{Value, json};

use super::lookups::Lookups;
use super::{AutoScaling, Cluster, str_field, validation};
use crate::world::AwsError;

/// `NodeRecovery` of a CreateCluster or UpdateCluster request, if it names one.
pub(super) fn node_recovery(body: &Value) -> Result<Option<String>, AwsError> {
    match str_field(body, "NodeRecovery") {
        None => Ok(None),
        Some(nr @ ("Automatic" | "None")) => Ok(Some(nr.to_owned())),
        Some(_) => Err(validation("NodeRecovery must be Automatic or None")),
    }
}

/// An IAM role ARN as the model's `RoleArn` shape has it (20 to 2,048 characters).
pub(super) const ROLE_ARN: &str = r"^arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+$";

/// A request field that is there and not null.
pub(super) fn given<'a>(body: &'a Value, key: &str) -> Option<&'a Value> {
    body.get(key).filter(|v| !v.is_null())
}

/// A string enum member of a request: `None` when absent, AWS's refusal when not one of
/// `allowed`. `at` is the member's path as AWS's messages spell it.
pub(super) fn member<'a>(
    v: &'a Value,
    key: &str,
    at: &str,
    allowed: &[&str],
) -> Result<Option<&'a str>, AwsError> {
    let Some(value) = given(v, key) else {
        return Ok(None);
    };
    match value.as_str() {
        Some(s) if allowed.contains(&s) => Ok(Some(s)),
        _ => Err(validation(format!(
            "1 validation error detected: Value '{}' at '{at}' failed to satisfy constraint: Member must satisfy enum value set: [{}]",
            value
                .as_str()
                .map_or_else(|| value.to_string(), str::to_owned),
            allowed.join(", ")
        ))),
    }
}

pub(super) fn required(at: &str) -> AwsError {
    validation(format!(
        "1 validation error detected: Value null at '{at}' failed to satisfy constraint: Member must not be null"
    ))
}

/// Applies the cluster-level settings of a CreateCluster or UpdateCluster request
/// (NodeRecovery, NodeProvisioningMode, ClusterRole, AutoScaling, TieredStorageConfig) to
/// `c`, a copy the caller keeps only if this succeeds. A field the request leaves out
/// keeps its value. Field shapes are checked first, then how the settings fit together:
/// autoscaling (managed Karpenter) needs a cluster role, an EKS orchestrator, continuous
/// provisioning and automatic node recovery, and its role cannot change while it is on.
/// `op` is the call's operation and `failure` the message of a `fails` fault registered
/// for it, for an install to end with.
pub(super) fn apply_settings(
    c: &mut Cluster,
    body: &Value,
    lookups: &Lookups,
    now: f64,
    op: &'static str,
    failure: Option<String>,
) -> Result<(), AwsError> {
    let provisioning = member(
        body,
        "NodeProvisioningMode",
        "nodeProvisioningMode",
        &["Continuous"],
    )?;
    let recovery = node_recovery(body)?;
    let mut auto_scaling = None;
    if let Some(a) = given(body, "AutoScaling") {
        let mode = member(a, "Mode", "autoScaling.mode", &["Enable", "Disable"])?
            .ok_or_else(|| required("autoScaling.mode"))?;
        let scaler = member(
            a,
            "AutoScalerType",
            "autoScaling.autoScalerType",
            &["Karpenter"],
        )?
        .unwrap_or("Karpenter");
        auto_scaling = Some((mode == "Enable", scaler));
    }
    let role = match given(body, "ClusterRole") {
        None => None,
        Some(v) => {
            let role = v.as_str().unwrap_or_default();
            let pattern = regex::Regex::new(ROLE_ARN).map_err(|e| validation(e.to_string()))?;
            if !(20..=2048).contains(&role.len()) || !pattern.is_match(role) {
                return Err(validation(format!(
                    "1 validation error detected: Value '{role}' at 'clusterRole' failed to satisfy constraint: Member must satisfy regular expression pattern: {ROLE_ARN}"
                )));
            }
            Some(role)
        }
    };
    let mut tiered = None;
    if let Some(t) = given(body, "TieredStorageConfig") {
        let mode = member(
            t,
            "Mode",
            "tieredStorageConfig.mode",
            &["Enable", "Disable"],
        )?
        .ok_or_else(|| required("tieredStorageConfig.mode"))?;
        let at = "tieredStorageConfig.instanceMemoryAllocationPercentage";
        let mut config = json!({ "Mode": mode });
        if let Some(p) = given(t, "InstanceMemoryAllocationPercentage") {
            match p.as_i64() {
                Some(n @ 0..=100) => config["InstanceMemoryAllocationPercentage"] = json!(n),
                Some(n) if n < 0 => {
                    return Err(validation(format!(
                        "1 validation error detected: Value '{n}' at '{at}' failed to satisfy constraint: Member must have value greater than or equal to 0"
                    )));
                }
                Some(n) => {
                    return Err(validation(format!(
                        "1 validation error detected: Value '{n}' at '{at}' failed to satisfy constraint: Member must have value less than or equal to 100"
                    )));
                }
                None => return Err(validation(format!("{at} must be an integer, not {p}"))),
            }
        }
        tiered = Some(config);
    }

    let on_eks = c.orchestrator.get("Eks").is_some();
    if let Some(p) = provisioning {
        c.provisioning = Some(p.to_owned());
    }
    if let Some(nr) = recovery {
        c.node_recovery = nr;
    }
    let was_enabled = c.auto_scaling.as_ref().is_some_and(|a| a.enabled);
    if let Some((enable, scaler)) = auto_scaling
        && enable != was_enabled
    {
        c.auto_scaling = Some(AutoScaling {
            enabled: enable,
            scaler: scaler.to_owned(),
            since: now,
            by: op,
            failure: failure.filter(|_| enable),
        });
    }
    let enabled = c.auto_scaling.as_ref().is_some_and(|a| a.enabled);
    if let Some(role) = role {
        if was_enabled && enabled && c.cluster_role.as_deref() != Some(role) {
            return Err(validation(
                "ClusterRole cannot be updated while autoscaling is enabled; disable autoscaling first",
            ));
        }
        if !lookups.role_exists(role) {
            return Err(validation(format!(
                "Cluster role {role} does not exist or cannot be assumed"
            )));
        }
        c.cluster_role = Some(role.to_owned());
    }
    if enabled {
        // Managed Karpenter's prerequisites, as the autoscaling guide lists them.
        let unmet = if c.cluster_role.is_none() {
            Some("a ClusterRole (an IAM role HyperPod assumes to add and remove nodes)")
        } else if !on_eks {
            Some("an EKS orchestrator")
        } else if c.provisioning.as_deref() != Some("Continuous") {
            Some("NodeProvisioningMode Continuous")
        } else if c.node_recovery != "Automatic" {
            Some("NodeRecovery Automatic")
        } else {
            None
        };
        if let Some(unmet) = unmet {
            return Err(validation(format!(
                "AutoScaling with Mode Enable requires {unmet}"
            )));
        }
    }
    if let Some(config) = tiered {
        // Managed tiered checkpointing runs on EKS-orchestrated clusters only.
        if !on_eks {
            return Err(validation(
                "TieredStorageConfig is supported only for clusters with an EKS orchestrator",
            ));
        }
        c.tiered = Some(config);
    }
    Ok(())
}

/// Takes the cluster-level settings `apply_settings` left on `from`; the tiered storage
/// in force so far stays what the nodes run until this update is over.
pub(super) fn take_settings(c: &mut Cluster, from: &Cluster) {
    c.node_recovery = from.node_recovery.clone();
    c.provisioning = from.provisioning.clone();
    c.cluster_role = from.cluster_role.clone();
    c.auto_scaling = from.auto_scaling.clone();
    c.tiered_before = c.tiered.take();
    c.tiered = from.tiered.clone();
}
