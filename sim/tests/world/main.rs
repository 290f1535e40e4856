//! Every black-box test of the sim in one binary (each test binary links the AWS SDKs
//! the tests drive the sim with; on two cores one link instead of eight is minutes per
//! build): the sim's EKS, HyperPod, Kubernetes API server, MLflow and moto front, as
//! the real SDKs, kube-rs and kubectl see them.

mod support;

mod eks;
mod fsx;
mod hyperpod;
mod hyperpod_autoscaling;
mod hyperpod_nodes;
mod jumpstart;
mod keda;
mod kube;
mod kubectl;
mod mlflow;
mod proxy;
mod serving;
mod training_plans;
