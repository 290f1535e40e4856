//! hypd: a control plane for GPU training and inference clusters on AWS (EKS + SageMaker
//! HyperPod). One process serves the web console, REST and MCP on one port; every face
//! goes through the same service layer.

pub mod agent;
pub mod audit;
pub mod auth;
pub mod aws;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod confirm;
pub mod faces;
pub mod features;
pub mod inference;
pub mod inspect;
pub mod instance_group;
pub mod mlflow;
pub mod model;
pub mod node;
pub mod operation;
pub mod resources;
pub mod retention;
pub mod sandbox;
pub mod service;
pub mod software;
pub mod storage;
pub mod store;
pub mod telemetry;
pub mod tokens;
pub mod training;
