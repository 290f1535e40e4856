//! What capacity the account has for HyperPod, as pre-flights read it: the "<type> for
//! cluster usage" quotas (Service Quotas), the instances HyperPod clusters already hold,
//! and training plans. Read-only: nothing here changes the account.

use std::collections::BTreeMap;

use app::api::ApiError;
use app::api::inspect::{Reserved, TrainingPlanInfo};
use aws_sdk_sagemaker::types::TrainingPlanStatus;

use super::Client;
use crate::aws::SdkResultExt;

/// The quota's name as Service Quotas lists it.
pub fn quota_name(ml_type: &str) -> String {
    format!("{ml_type} for cluster usage")
}

/// The account's cluster-usage quota for each of `ml_types` in the region (types without
/// a listed quota are absent from the answer).
pub async fn cluster_usage_quotas(
    quotas: &aws_sdk_servicequotas::Client,
    ml_types: &[&str],
) -> Result<BTreeMap<String, f64>, ApiError> {
    let mut all = all_cluster_usage_quotas(quotas).await?;
    all.retain(|t, _| ml_types.contains(&t.as_str()));
    Ok(all)
}

/// Every cluster-usage quota of the account in the region, by HyperPod type.
pub async fn all_cluster_usage_quotas(
    quotas: &aws_sdk_servicequotas::Client,
) -> Result<BTreeMap<String, f64>, ApiError> {
    let mut found = BTreeMap::new();
    let mut pages = quotas
        .list_service_quotas()
        .service_code("sagemaker")
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        let page = page.upstream("servicequotas", "ListServiceQuotas")?;
        for q in page.quotas() {
            if let (Some(name), Some(value)) = (q.quota_name(), q.value())
                && let Some(ml_type) = name.strip_suffix(" for cluster usage")
                && ml_type.starts_with("ml.")
            {
                found.insert(ml_type.to_owned(), value);
            }
        }
    }
    Ok(found)
}

/// Instances of each type that the region's HyperPod clusters are asked to hold now.
pub async fn instances_in_use(sagemaker: &Client) -> Result<BTreeMap<String, i64>, ApiError> {
    let mut used = BTreeMap::new();
    let mut clusters = sagemaker.list_clusters().into_paginator().send();
    while let Some(page) = clusters.next().await {
        let page = page.upstream("sagemaker", "ListClusters")?;
        for summary in page.cluster_summaries() {
            let Some(name) = summary.cluster_name() else {
                continue;
            };
            // Deleted between the list and the describe: it holds nothing.
            let Some(c) = sagemaker
                .describe_cluster()
                .cluster_name(name)
                .send()
                .await
                .found("sagemaker", "DescribeCluster")?
            else {
                continue;
            };
            for g in c.instance_groups() {
                if let Some(t) = g.instance_type() {
                    *used.entry(t.as_str().to_owned()).or_default() +=
                        i64::from(g.target_count().unwrap_or(0));
                }
            }
        }
    }
    Ok(used)
}

/// A training plan as a pre-flight needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainingPlan {
    pub status: Option<TrainingPlanStatus>,
    /// (instance type, Availability Zone) of each reserved capacity.
    pub reserved: Vec<(Option<String>, Option<String>)>,
    pub available_instances: i32,
}

impl TrainingPlan {
    /// Active or Scheduled: the only states that provide capacity.
    pub fn usable(&self) -> bool {
        matches!(
            self.status,
            Some(TrainingPlanStatus::Active | TrainingPlanStatus::Scheduled)
        )
    }
}

/// The training plan named `name` (the last part of its ARN), `None` when there is none.
pub async fn training_plan(
    sagemaker: &Client,
    name: &str,
) -> Result<Option<TrainingPlan>, ApiError> {
    // SageMaker answers an unknown plan name with a ValidationException.
    let found = match sagemaker
        .describe_training_plan()
        .training_plan_name(name)
        .send()
        .await
        .allowing(
            "sagemaker",
            "DescribeTrainingPlan",
            &["ValidationException"],
        ) {
        Ok(found) => found,
        Err(ApiError::Upstream { code: Some(c), .. }) if c == "ResourceNotFound" => None,
        Err(e) => return Err(e),
    };
    Ok(found.map(|p| TrainingPlan {
        status: p.status().cloned(),
        reserved: p
            .reserved_capacity_summaries()
            .iter()
            .map(|rc| {
                (
                    rc.instance_type().map(|t| t.as_str().to_owned()),
                    rc.availability_zone().map(str::to_owned),
                )
            })
            .collect(),
        available_instances: p.available_instance_count().unwrap_or(0),
    }))
}

/// The region's training plans, as `list_capacity` shows them.
pub async fn training_plans(sagemaker: &Client) -> Result<Vec<TrainingPlanInfo>, ApiError> {
    let count = |n: Option<i32>| n.unwrap_or(0).max(0) as u32;
    let mut plans = Vec::new();
    let mut pages = sagemaker.list_training_plans().into_paginator().send();
    while let Some(page) = pages.next().await {
        let page = page.upstream("sagemaker", "ListTrainingPlans")?;
        for p in page.training_plan_summaries() {
            plans.push(TrainingPlanInfo {
                name: p.training_plan_name().unwrap_or_default().to_owned(),
                arn: p.training_plan_arn().unwrap_or_default().to_owned(),
                status: p
                    .status()
                    .map(|s| s.as_str().to_owned())
                    .unwrap_or_default(),
                available_instances: count(p.available_instance_count()),
                in_use_instances: count(p.in_use_instance_count()),
                reserved: p
                    .reserved_capacity_summaries()
                    .iter()
                    .map(|rc| Reserved {
                        instance_type: rc.instance_type().map(|t| t.as_str().to_owned()),
                        availability_zone: rc.availability_zone().map(str::to_owned),
                        instances: count(rc.total_instance_count()),
                    })
                    .collect(),
                start_time: p.start_time().map(ToString::to_string),
                end_time: p.end_time().map(ToString::to_string),
            });
        }
    }
    Ok(plans)
}
