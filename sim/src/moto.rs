//! What the sim asks moto: whether subnets and roles named in a request exist, as AWS
//! checks before accepting a cluster; a subnet's free addresses and a security group's
//! inbound rules, and the network interfaces an FSx file system takes (see `fsx`). moto speaks the AWS Query protocol and routes by
//! the credential scope of the Authorization header, which it does not verify.

use std::collections::BTreeSet;

use crate::world::AwsError;

#[derive(Clone, Debug)]
pub struct Moto {
    url: String,
    http: reqwest::Client,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subnet {
    pub id: String,
    pub vpc_id: String,
    pub availability_zone: String,
    /// The zone's account-independent id (`use1-az1`), as moto's zone table has it.
    pub availability_zone_id: String,
    pub cidr_block: String,
}

fn tag<'a>(xml: &'a str, name: &str) -> Option<&'a str> {
    let open = format!("<{name}>");
    let close = format!("</{name}>");
    let start = xml.find(&open)? + open.len();
    let end = xml[start..].find(&close)? + start;
    Some(&xml[start..end])
}

impl Moto {
    /// The client follows no redirects: the proxy must hand moto's answers (an S3 301
    /// included) back to the caller as they are.
    pub fn new(url: &str) -> anyhow::Result<Self> {
        Ok(Self {
            url: url.trim_end_matches('/').to_owned(),
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()?,
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// Writes an object into moto's S3 (path-style), as a pod writing through its
    /// Mountpoint volume would; the error says what S3 answered.
    pub async fn put_object(
        &self,
        region: &str,
        bucket: &str,
        key: &str,
        body: Vec<u8>,
    ) -> Result<(), String> {
        let auth = format!(
            "AWS4-HMAC-SHA256 Credential=testing/20260101/{region}/s3/aws4_request, SignedHeaders=host, Signature=0"
        );
        let response = self
            .http
            .put(format!("{}/{bucket}/{key}", self.url))
            .header("authorization", auth)
            .body(body)
            .send()
            .await
            .map_err(|e| format!("cannot reach S3: {e}"))?;
        if response.status().is_success() {
            Ok(())
        } else {
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            Err(format!(
                "S3 answered {status} writing s3://{bucket}/{key}: {text}"
            ))
        }
    }

    async fn query(
        &self,
        service: &str,
        region: &str,
        params: &[(String, String)],
    ) -> Result<String, AwsError> {
        let auth = format!(
            "AWS4-HMAC-SHA256 Credential=testing/20260101/{region}/{service}/aws4_request, SignedHeaders=host, Signature=0"
        );
        let response = self
            .http
            .post(format!("{}/", self.url))
            .header("authorization", auth)
            .form(params)
            .send()
            .await
            .map_err(unreachable)?;
        // moto answers 500 when its threads race on one backend (CI runs dozens of
        // clusters on one moto): that is moto failing, not the thing asked about
        // missing, so it is AWS's transient InternalFailure, which the caller's SDK retries.
        if response.status().is_server_error() {
            return Err(AwsError::new(
                500,
                "InternalFailure",
                format!("moto answered {} to {service}", response.status()),
            ));
        }
        response.text().await.map_err(|e| {
            AwsError::new(
                500,
                "InternalFailure",
                format!("hypd-sim cannot read moto's answer: {e}"),
            )
        })
    }

    /// The subnets, or the first one that does not exist.
    pub async fn subnets(&self, region: &str, ids: &[String]) -> Result<Vec<Subnet>, AwsError> {
        let mut subnets = Vec::new();
        for id in ids {
            let Some((subnet, _)) = self.subnet_with_free_ips(region, id).await? else {
                return Err(AwsError::invalid_parameter(format!(
                    "The subnet ID '{id}' does not exist (Service: Ec2, Status Code: 400, Error Code: InvalidSubnetID.NotFound)"
                )));
            };
            subnets.push(subnet);
        }
        Ok(subnets)
    }

    pub async fn security_group_exists(&self, region: &str, id: &str) -> Result<bool, AwsError> {
        Ok(self.security_group(region, id).await?.is_some())
    }

    /// A subnet with its free addresses (`AvailableIpAddressCount`), if it exists.
    pub async fn subnet_with_free_ips(
        &self,
        region: &str,
        id: &str,
    ) -> Result<Option<(Subnet, u32)>, AwsError> {
        let params = vec![
            ("Action".to_owned(), "DescribeSubnets".to_owned()),
            ("Version".to_owned(), "2016-11-15".to_owned()),
            ("SubnetId.1".to_owned(), id.to_owned()),
        ];
        let xml = self.query("ec2", region, &params).await?;
        if xml.contains("<Errors>") || tag(&xml, "subnetId") != Some(id) {
            return Ok(None);
        }
        let free = tag(&xml, "availableIpAddressCount")
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let subnet = Subnet {
            id: id.to_owned(),
            vpc_id: tag(&xml, "vpcId").unwrap_or_default().to_owned(),
            availability_zone: tag(&xml, "availabilityZone").unwrap_or_default().to_owned(),
            availability_zone_id: tag(&xml, "availabilityZoneId")
                .unwrap_or_default()
                .to_owned(),
            cidr_block: tag(&xml, "cidrBlock").unwrap_or_default().to_owned(),
        };
        Ok(Some((subnet, free)))
    }

    /// A security group with its inbound rules, if it exists.
    pub async fn security_group(
        &self,
        region: &str,
        id: &str,
    ) -> Result<Option<SecurityGroup>, AwsError> {
        let params = vec![
            ("Action".to_owned(), "DescribeSecurityGroups".to_owned()),
            ("Version".to_owned(), "2016-11-15".to_owned()),
            ("GroupId.1".to_owned(), id.to_owned()),
        ];
        let xml = self.query("ec2", region, &params).await?;
        if xml.contains("<Errors>") || tag(&xml, "groupId") != Some(id) {
            return Ok(None);
        }
        Ok(Some(parse_security_group(id, &xml)))
    }

    /// The id of VPC `vpc`'s `default` security group, which AWS gives a file system
    /// created without any.
    pub async fn default_security_group(
        &self,
        region: &str,
        vpc: &str,
    ) -> Result<Option<String>, AwsError> {
        let params = vec![
            ("Action".to_owned(), "DescribeSecurityGroups".to_owned()),
            ("Version".to_owned(), "2016-11-15".to_owned()),
            ("Filter.1.Name".to_owned(), "vpc-id".to_owned()),
            ("Filter.1.Value.1".to_owned(), vpc.to_owned()),
            ("Filter.2.Name".to_owned(), "group-name".to_owned()),
            ("Filter.2.Value.1".to_owned(), "default".to_owned()),
        ];
        let xml = self.query("ec2", region, &params).await?;
        Ok(tag(&xml, "groupId").map(str::to_owned))
    }

    /// Creates a network interface in `subnet` with `groups` (taking one of its
    /// addresses, as a file server's does); its id.
    pub async fn create_network_interface(
        &self,
        region: &str,
        subnet: &str,
        groups: &[String],
        description: &str,
    ) -> Result<String, AwsError> {
        let mut params = vec![
            ("Action".to_owned(), "CreateNetworkInterface".to_owned()),
            ("Version".to_owned(), "2016-11-15".to_owned()),
            ("SubnetId".to_owned(), subnet.to_owned()),
            ("Description".to_owned(), description.to_owned()),
        ];
        for (i, g) in groups.iter().enumerate() {
            params.push((format!("SecurityGroupId.{}", i + 1), g.clone()));
        }
        let xml = self.query("ec2", region, &params).await?;
        tag(&xml, "networkInterfaceId")
            .map(str::to_owned)
            .ok_or_else(|| {
                AwsError::new(
                    500,
                    "InternalServerError",
                    format!("moto refused a network interface in {subnet}: {xml}"),
                )
            })
    }

    /// Deletes a network interface; one already gone is no error.
    pub async fn delete_network_interface(&self, region: &str, id: &str) -> Result<(), AwsError> {
        let params = vec![
            ("Action".to_owned(), "DeleteNetworkInterface".to_owned()),
            ("Version".to_owned(), "2016-11-15".to_owned()),
            ("NetworkInterfaceId".to_owned(), id.to_owned()),
        ];
        self.query("ec2", region, &params).await.map(drop)
    }

    /// Whether S3 bucket `bucket` exists (path-style `HEAD`).
    pub async fn bucket_exists(&self, region: &str, bucket: &str) -> Result<bool, AwsError> {
        let auth = format!(
            "AWS4-HMAC-SHA256 Credential=testing/20260101/{region}/s3/aws4_request, SignedHeaders=host, Signature=0"
        );
        let response = self
            .http
            .head(format!("{}/{bucket}", self.url))
            .header("authorization", auth)
            .send()
            .await
            .map_err(unreachable)?;
        Ok(response.status().is_success())
    }

    pub async fn role_exists(&self, region: &str, role_arn: &str) -> Result<bool, AwsError> {
        let Some(name) = role_arn
            .rsplit('/')
            .next()
            .filter(|_| role_arn.contains(":role/"))
        else {
            return Ok(false);
        };
        let params = vec![
            ("Action".to_owned(), "GetRole".to_owned()),
            ("Version".to_owned(), "2010-05-08".to_owned()),
            ("RoleName".to_owned(), name.to_owned()),
        ];
        let xml = self.query("iam", region, &params).await?;
        Ok(tag(&xml, "Arn").is_some_and(|arn| arn == role_arn))
    }
}

/// A security group's inbound rules, as far as the sim reads them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SecurityGroup {
    pub id: String,
    pub inbound: Vec<Rule>,
}

/// One inbound permission: a protocol (`tcp`, `-1` for all traffic...), a port range
/// (none for all traffic), and the groups and IPv4 CIDR blocks it admits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rule {
    pub protocol: String,
    pub ports: Option<(u16, u16)>,
    pub groups: Vec<String>,
    pub cidrs: Vec<String>,
}

/// The contents of the top-level `<item>` elements of `xml`.
fn items(xml: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start, mut i) = (0usize, 0usize, 0usize);
    while i < xml.len() {
        let rest = &xml[i..];
        if rest.starts_with("<item>") {
            if depth == 0 {
                start = i + "<item>".len();
            }
            depth += 1;
            i += "<item>".len();
        } else if rest.starts_with("</item>") {
            depth = depth.saturating_sub(1);
            if depth == 0 {
                out.push(&xml[start..i]);
            }
            i += "</item>".len();
        } else {
            i += rest.chars().next().map_or(1, char::len_utf8);
        }
    }
    out
}

fn parse_security_group(id: &str, xml: &str) -> SecurityGroup {
    let inbound = tag(xml, "ipPermissions")
        .map(items)
        .unwrap_or_default()
        .into_iter()
        .map(|p| {
            let port = |name| tag(p, name).and_then(|v| v.parse::<i64>().ok());
            let ports = match (port("fromPort"), port("toPort")) {
                (Some(from), Some(to)) if from >= 0 && to >= 0 => {
                    Some((from.min(65535) as u16, to.min(65535) as u16))
                }
                _ => None,
            };
            let list = |outer, inner| {
                tag(p, outer)
                    .map(items)
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|i| tag(i, inner).map(str::to_owned))
                    .collect()
            };
            Rule {
                protocol: tag(p, "ipProtocol").unwrap_or_default().to_owned(),
                ports,
                groups: list("groups", "groupId"),
                cidrs: list("ipRanges", "cidrIp"),
            }
        })
        .collect();
    SecurityGroup {
        id: id.to_owned(),
        inbound,
    }
}

/// At least two Availability Zones among the subnets, as EKS requires.
pub fn distinct_zones(subnets: &[Subnet]) -> usize {
    subnets
        .iter()
        .map(|s| s.availability_zone.as_str())
        .collect::<BTreeSet<_>>()
        .len()
}

/// What a call the sim makes to moto answers when moto cannot be reached.
pub fn unreachable(e: reqwest::Error) -> AwsError {
    AwsError::new(
        500,
        "InternalFailure",
        format!("hypd-sim cannot reach moto: {e}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tags() {
        let xml = "<a><subnetId>subnet-1</subnetId><vpcId>vpc-1</vpcId></a>";
        assert_eq!(tag(xml, "vpcId"), Some("vpc-1"));
        assert_eq!(tag(xml, "nope"), None);
    }

    #[test]
    fn reads_a_security_groups_inbound_rules_as_moto_writes_them() {
        let xml = "<securityGroupInfo><item><groupId>sg-1</groupId><ipPermissionsEgress/><ipPermissions>\
            <item><ipProtocol>tcp</ipProtocol><fromPort>988</fromPort><toPort>988</toPort><groups><item>\
            <userId>1</userId><groupId>sg-1</groupId></item></groups><ipRanges/></item><item>\
            <ipProtocol>-1</ipProtocol><groups/><ipRanges><item><cidrIp>10.0.0.0/16</cidrIp></item>\
            </ipRanges></item></ipPermissions></item></securityGroupInfo>";
        let g = parse_security_group("sg-1", xml);
        assert_eq!(g.inbound.len(), 2);
        assert_eq!(g.inbound[0].ports, Some((988, 988)));
        assert_eq!(g.inbound[0].groups, ["sg-1"]);
        assert_eq!(g.inbound[1].protocol, "-1");
        assert_eq!(g.inbound[1].ports, None);
        assert_eq!(g.inbound[1].cidrs, ["10.0.0.0/16"]);
    }
}
