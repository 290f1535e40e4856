//! What the sim asks moto: whether subnets and roles named in a request exist, as AWS
//! checks before accepting a cluster. moto speaks the AWS Query protocol and routes by
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
            .map_err(|e| {
                AwsError::new(
                    500,
                    "InternalFailure",
                    format!("hypd-sim cannot reach moto: {e}"),
                )
            })?;
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
            let params = vec![
                ("Action".to_owned(), "DescribeSubnets".to_owned()),
                ("Version".to_owned(), "2016-11-15".to_owned()),
                ("SubnetId.1".to_owned(), id.clone()),
            ];
            let xml = self.query("ec2", region, &params).await?;
            if xml.contains("<Errors>") || tag(&xml, "subnetId").is_none() {
                return Err(AwsError::invalid_parameter(format!(
                    "The subnet ID '{id}' does not exist (Service: Ec2, Status Code: 400, Error Code: InvalidSubnetID.NotFound)"
                )));
            }
            subnets.push(Subnet {
                id: id.clone(),
                vpc_id: tag(&xml, "vpcId").unwrap_or_default().to_owned(),
                availability_zone: tag(&xml, "availabilityZone").unwrap_or_default().to_owned(),
                availability_zone_id: tag(&xml, "availabilityZoneId")
                    .unwrap_or_default()
                    .to_owned(),
                cidr_block: tag(&xml, "cidrBlock").unwrap_or_default().to_owned(),
            });
        }
        Ok(subnets)
    }

    pub async fn security_group_exists(&self, region: &str, id: &str) -> Result<bool, AwsError> {
        let params = vec![
            ("Action".to_owned(), "DescribeSecurityGroups".to_owned()),
            ("Version".to_owned(), "2016-11-15".to_owned()),
            ("GroupId.1".to_owned(), id.to_owned()),
        ];
        let xml = self.query("ec2", region, &params).await?;
        Ok(!xml.contains("<Errors>") && tag(&xml, "groupId") == Some(id))
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

/// At least two Availability Zones among the subnets, as EKS requires.
pub fn distinct_zones(subnets: &[Subnet]) -> usize {
    subnets
        .iter()
        .map(|s| s.availability_zone.as_str())
        .collect::<BTreeSet<_>>()
        .len()
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
}
