//! The S3 gateway endpoint on the private route table: node and pod traffic to the shared
//! bucket stays inside AWS and costs no NAT data processing.

use app::api::ApiError;
use app::api::plan::{Action, Change, KNOWN_AFTER_APPLY};
use aws_sdk_ec2::types::{ResourceType, VpcEndpointType};
use serde_json::json;

use super::{Client, filter, name, of_cluster, tags_for};
use crate::aws::SdkResultExt;
use crate::resources::{Listed, Resource};

const KIND: &str = "ec2:VpcEndpoint";
const ROLE: &str = "s3-endpoint";

pub struct S3Endpoint {
    pub ec2: Client,
    pub cluster: String,
    pub region: String,
    pub vpc_id: String,
    pub route_table_id: String,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    Create,
}

fn live(e: &aws_sdk_ec2::types::VpcEndpoint) -> bool {
    !matches!(e.state().map(|s| s.as_str()), Some("deleted" | "deleting"))
}

impl S3Endpoint {
    fn service(&self) -> String {
        format!("com.amazonaws.{}.s3", self.region)
    }
}

impl Resource for S3Endpoint {
    /// The live endpoint's id.
    type Observed = Option<String>;
    type Op = Op;

    async fn observe(&self) -> Result<Option<String>, ApiError> {
        let out = self
            .ec2
            .describe_vpc_endpoints()
            .filters(filter("vpc-id", &self.vpc_id))
            .filters(filter("service-name", &self.service()))
            .send()
            .await
            .upstream("ec2", "DescribeVpcEndpoints")?;
        Ok(out
            .vpc_endpoints()
            .iter()
            .find(|e| live(e))
            .and_then(|e| e.vpc_endpoint_id().map(str::to_owned)))
    }

    fn diff(&self, observed: &Option<String>) -> Result<Vec<Op>, ApiError> {
        Ok(if observed.is_some() {
            Vec::new()
        } else {
            vec![Op::Create]
        })
    }

    async fn apply(&self, _: &Op, observed: &mut Option<String>) -> Result<(), ApiError> {
        let out = self
            .ec2
            .create_vpc_endpoint()
            .vpc_id(&self.vpc_id)
            .service_name(self.service())
            .vpc_endpoint_type(VpcEndpointType::Gateway)
            .route_table_ids(&self.route_table_id)
            .client_token(format!("hypd-{}-s3", self.cluster))
            .tag_specifications(tags_for(
                ResourceType::VpcEndpoint,
                &self.cluster,
                ROLE,
                &[],
            ))
            .send()
            .await
            .upstream("ec2", "CreateVpcEndpoint")?;
        *observed = Some(
            out.vpc_endpoint()
                .and_then(|e| e.vpc_endpoint_id())
                .ok_or_else(|| ApiError::internal("CreateVpcEndpoint answered without an id"))?
                .to_owned(),
        );
        Ok(())
    }

    fn describe(&self, _: &Op, _: &Option<String>) -> Change {
        Change::new(Action::Create, KIND, name(&self.cluster, ROLE))
            .field("service_name", None, Some(json!(self.service())))
            .field("route_table_ids", None, Some(json!([self.route_table_id])))
            .field("vpc_endpoint_id", None, Some(json!(KNOWN_AFTER_APPLY)))
    }
    fn assume(&self, _: &Op, observed: &mut Option<String>) {
        *observed = Some(KNOWN_AFTER_APPLY.to_owned());
    }
}

/// Teardown: the cluster's live endpoints.
pub struct ClusterEndpoints {
    pub ec2: Client,
    pub cluster: String,
}

impl Listed for ClusterEndpoints {
    const KIND: &'static str = KIND;

    async fn list(&self) -> Result<Vec<String>, ApiError> {
        let out = self
            .ec2
            .describe_vpc_endpoints()
            .set_filters(Some(of_cluster(&self.cluster)))
            .send()
            .await
            .upstream("ec2", "DescribeVpcEndpoints")?;
        Ok(out
            .vpc_endpoints()
            .iter()
            .filter(|e| e.state().map(|s| s.as_str()) != Some("deleted"))
            .filter_map(|e| e.vpc_endpoint_id().map(str::to_owned))
            .collect())
    }

    async fn delete(&self, id: &str) -> Result<(), ApiError> {
        self.ec2
            .delete_vpc_endpoints()
            .vpc_endpoint_ids(id)
            .send()
            .await
            .upstream("ec2", "DeleteVpcEndpoints")?;
        Ok(())
    }
}
