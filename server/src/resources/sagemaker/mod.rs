//! SageMaker HyperPod: the cluster on an EKS control plane with its instance groups, and
//! what pre-flights read about capacity (the account's cluster-usage quotas, training
//! plans). Instance groups are taken as plain group specs, so creating a cluster, adding
//! a group and scaling one share the same code.

pub mod capacity;
pub mod cluster;
pub mod nodes;
pub mod software;
pub mod tiered_storage;

pub use aws_sdk_sagemaker::Client;
