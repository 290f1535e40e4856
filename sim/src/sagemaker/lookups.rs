//! What a SageMaker request names that moto owns (execution and cluster roles, subnets
//! and their zones, security groups), asked before EKS and SageMaker are locked because
//! moto is another process; the answers are then checked under the lock like AWS's own
//! look-ups.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::moto::{Moto, Subnet};
use crate::world::AwsError;

/// moto's answers for one request. Without moto nothing is asked and everything named
/// is taken to exist.
#[derive(Default, Debug)]
pub struct Lookups {
    roles: BTreeMap<String, bool>,
    subnets: BTreeMap<String, Option<Subnet>>,
    security_groups: BTreeMap<String, bool>,
}

/// The strings of a JSON array (none when it is absent or not an array).
pub(super) fn strings(v: Option<&Value>) -> impl Iterator<Item = &str> {
    v.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

impl Lookups {
    pub async fn gather(
        moto: Option<&Moto>,
        region: &str,
        op: &str,
        body: &Value,
    ) -> Result<Self, AwsError> {
        let mut out = Self::default();
        let Some(moto) = moto else {
            return Ok(out);
        };
        let mut roles = Vec::new();
        let mut subnets = Vec::new();
        let mut groups = Vec::new();
        match op {
            "CreateCluster" | "UpdateCluster" => {
                let vpcs = std::iter::once(body.get("VpcConfig")).chain(
                    strings_of(body.get("InstanceGroups")).map(|g| g.get("OverrideVpcConfig")),
                );
                for vpc in vpcs.flatten() {
                    subnets.extend(strings(vpc.get("Subnets")));
                    groups.extend(strings(vpc.get("SecurityGroupIds")));
                }
                roles.extend(
                    strings_of(body.get("InstanceGroups"))
                        .filter_map(|g| g.get("ExecutionRole").and_then(Value::as_str)),
                );
                roles.extend(body.get("ClusterRole").and_then(Value::as_str));
            }
            "CreateMlflowTrackingServer" => {
                roles.extend(body.get("RoleArn").and_then(Value::as_str));
            }
            _ => {}
        }
        for role in roles {
            if !out.roles.contains_key(role) {
                let exists = moto.role_exists(region, role).await?;
                out.roles.insert(role.to_owned(), exists);
            }
        }
        for id in subnets {
            if !out.subnets.contains_key(id) {
                let subnet = match moto.subnets(region, &[id.to_owned()]).await {
                    Ok(mut found) => found.pop(),
                    Err(e) if e.code == "InternalFailure" => return Err(e),
                    Err(_) => None,
                };
                out.subnets.insert(id.to_owned(), subnet);
            }
        }
        for id in groups {
            if !out.security_groups.contains_key(id) {
                let exists = moto.security_group_exists(region, id).await?;
                out.security_groups.insert(id.to_owned(), exists);
            }
        }
        Ok(out)
    }

    pub fn role_exists(&self, arn: &str) -> bool {
        self.roles.get(arn).copied().unwrap_or(true)
    }

    /// Lookups in which moto knew `subnet`, for tests that place nodes.
    #[cfg(test)]
    pub fn with_subnet(mut self, subnet: Subnet) -> Self {
        self.subnets.insert(subnet.id.clone(), Some(subnet));
        self
    }

    /// What moto said of a subnet, if it was asked and the subnet exists.
    pub fn subnet(&self, id: &str) -> Option<&Subnet> {
        self.subnets.get(id)?.as_ref()
    }

    /// The subnet's zone, `None` if moto was not asked; an error if it does not exist.
    pub fn subnet_zone(&self, id: &str) -> Result<Option<&str>, AwsError> {
        match self.subnets.get(id) {
            None => Ok(None),
            Some(Some(s)) => Ok(Some(s.availability_zone.as_str())),
            Some(None) => Err(AwsError::new(
                400,
                "ValidationException",
                format!("The subnet ID '{id}' does not exist"),
            )),
        }
    }

    /// Checks a `VpcConfig` / `OverrideVpcConfig`: every subnet and security group
    /// exists. `at` names the field in AWS's message.
    pub fn check_vpc(&self, vpc: Option<&Value>, at: &str) -> Result<(), AwsError> {
        let Some(vpc) = vpc else {
            return Ok(());
        };
        for id in strings(vpc.get("Subnets")) {
            self.subnet_zone(id).map_err(|_| {
                AwsError::new(
                    400,
                    "ValidationException",
                    format!("Invalid subnet ID '{id}' in {at}: the subnet does not exist"),
                )
            })?;
        }
        for id in strings(vpc.get("SecurityGroupIds")) {
            if !self.security_groups.get(id).copied().unwrap_or(true) {
                return Err(AwsError::new(
                    400,
                    "ValidationException",
                    format!(
                        "Invalid security group ID '{id}' in {at}: the security group does not exist"
                    ),
                ));
            }
        }
        Ok(())
    }
}

fn strings_of(v: Option<&Value>) -> impl Iterator<Item = &Value> {
    v.and_then(Value::as_array).into_iter().flatten()
}
