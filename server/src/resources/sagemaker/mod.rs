//! SageMaker HyperPod: the cluster on an EKS control plane with its instance groups, and
//! what pre-flights read about capacity (the account's cluster-usage quotas, training
//! plans). Instance groups are taken as plain group specs, so creating a cluster, adding
//! a group and scaling one share the same code.

pub mod autoscaling;
pub mod capacity;
pub mod cluster;
pub mod nodes;
pub mod software;
pub mod tiered_storage;
pub mod tracking_server;

pub use aws_sdk_sagemaker::Client;

/// HyperPod cluster `name` as DescribeCluster gives it, for callers that read several of
/// its settings from one call.
pub async fn described(
    sagemaker: &Client,
    name: &str,
) -> Result<aws_sdk_sagemaker::operation::describe_cluster::DescribeClusterOutput, app::api::ApiError>
{
    use crate::aws::SdkResultExt;
    sagemaker
        .describe_cluster()
        .cluster_name(name)
        .send()
        .await
        .upstream("sagemaker", "DescribeCluster")
}
