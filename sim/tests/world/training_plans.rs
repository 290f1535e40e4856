//! The real `aws-sdk-sagemaker` client buys training plans from hypd-sim's offerings
//! table and uses them in HyperPod instance groups: Pending → Active (or Scheduled) on
//! the clock, and CreateCluster refusing a plan that is not ready, is for another
//! instance type, has no room left or reserves capacity in another zone.

use aws_sdk_sagemaker::types::{
    ClusterInstanceStatus, ClusterInstanceType, ReservedCapacityInstanceType,
    SageMakerResourceName, TrainingPlanFilter, TrainingPlanFilterName, TrainingPlanSortBy,
    TrainingPlanSortOrder, TrainingPlanStatus, VpcConfig,
};
use serde_json::json;
use crate::support::{
    Network, active_eks_cluster, control, create_refused, eks_client, hyperpod_create,
    hyperpod_group, moto, network, refused, sagemaker_client, set_time_scale, sim, wait_for,
};

const SCALE: f64 = 600.0;

fn offering(id: &str, instance_type: &str, zone: &str, starts_in_hours: f64) -> serde_json::Value {
    json!({
        "id": id, "instance_type": instance_type, "instance_count": 2,
        "availability_zone": zone, "duration_hours": 168, "upfront_fee": "16512.00",
        "starts_in_hours": starts_in_hours
    })
}

fn planned_group(
    net: &Network,
    count: i32,
    instance_type: ClusterInstanceType,
    plan: &str,
    subnet: Option<&str>,
) -> aws_sdk_sagemaker::types::ClusterInstanceGroupSpecification {
    let mut g = hyperpod_group(net, count, instance_type);
    g.training_plan_arn = Some(plan.to_owned());
    g.override_vpc_config = subnet.map(|s| {
        VpcConfig::builder()
            .subnets(s)
            .security_group_ids(&net.security_group)
            .build()
    });
    g
}

#[tokio::test(flavor = "multi_thread")]
async fn training_plans_reserve_capacity_for_hyperpod() {
    let (_moto, moto_url) = moto();
    let net = network(&moto_url).await;
    let (_sim, sim_url) = sim(&moto_url, SCALE);
    let eks = eks_client(&sim_url).await;
    let sm = sagemaker_client(&sim_url).await;
    let eks_arn = active_eks_cluster(&eks, &net, "ml").await;
    let set = control(
        &sim_url,
        reqwest::Method::PUT,
        "/_sim/sagemaker/training-plan-offerings",
        json!([
            offering("tpo-a", "ml.p5.48xlarge", "us-east-1a", 0.0),
            offering("tpo-b", "ml.p5.48xlarge", "us-east-1b", 0.0),
            offering("tpo-g", "ml.g6e.48xlarge", "us-east-1a", 48.0),
        ]),
    )
    .await;
    assert_eq!(set["offerings"], 3);

    let (code, _) = refused(
        sm.search_training_plan_offerings()
            .send()
            .await
            .unwrap_err(),
    );
    assert_eq!(code, "ValidationException");
    let found = sm
        .search_training_plan_offerings()
        .instance_type(ReservedCapacityInstanceType::MlP548Xlarge)
        .instance_count(2)
        .target_resources(SageMakerResourceName::HyperpodCluster)
        .send()
        .await
        .unwrap()
        .training_plan_offerings
        .unwrap();
    let ids: Vec<&str> = found
        .iter()
        .filter_map(|o| o.training_plan_offering_id())
        .collect();
    assert_eq!(ids, ["tpo-a", "tpo-b"]);
    let rc = &found[0].reserved_capacity_offerings()[0];
    assert_eq!(rc.availability_zone(), Some("us-east-1a"));
    assert_eq!(rc.instance_count(), Some(2));
    assert_eq!(found[0].duration_hours(), Some(168));
    assert_eq!(found[0].upfront_fee(), Some("16512.00"));

    // A new plan is Pending while it is paid for, and cannot hold instances yet.
    set_time_scale(&sim_url, 0.0).await;
    let arn = sm
        .create_training_plan()
        .training_plan_name("plan-a")
        .training_plan_offering_id("tpo-a")
        .send()
        .await
        .unwrap()
        .training_plan_arn
        .unwrap();
    assert_eq!(
        arn,
        "arn:aws:sagemaker:us-east-1:123456789012:training-plan/plan-a"
    );
    let plan = sm
        .describe_training_plan()
        .training_plan_name("plan-a")
        .send()
        .await
        .unwrap();
    assert_eq!(plan.status, Some(TrainingPlanStatus::Pending));
    assert_eq!(plan.total_instance_count, Some(2));
    assert_eq!(
        plan.reserved_capacity_summaries()[0].availability_zone(),
        Some("us-east-1a")
    );
    let group = planned_group(
        &net,
        2,
        ClusterInstanceType::MlP548Xlarge,
        &arn,
        Some(&net.subnets[0]),
    );
    let (code, message) = create_refused(&sm, "trained", &eks_arn, &net, group).await;
    assert_eq!(code, "ValidationException");
    assert!(message.contains("is Pending"), "{message}");

    // A taken name, a bought offering, an offering that never was.
    for (name, offering, expected) in [
        ("plan-a", "tpo-b", "ResourceInUse"),
        ("plan-x", "tpo-a", "ResourceLimitExceeded"),
        ("plan-x", "tpo-nope", "ResourceNotFound"),
    ] {
        let (code, _) = refused(
            sm.create_training_plan()
                .training_plan_name(name)
                .training_plan_offering_id(offering)
                .send()
                .await
                .unwrap_err(),
        );
        assert_eq!(code, expected, "{name} from {offering}");
    }
    let left = sm
        .search_training_plan_offerings()
        .target_resources(SageMakerResourceName::HyperpodCluster)
        .send()
        .await
        .unwrap()
        .training_plan_offerings
        .unwrap();
    assert!(
        left.iter()
            .all(|o| o.training_plan_offering_id() != Some("tpo-a")),
        "a bought offering is gone"
    );

    set_time_scale(&sim_url, SCALE).await;
    wait_for("plan Active", || async {
        sm.describe_training_plan()
            .training_plan_name("plan-a")
            .send()
            .await
            .unwrap()
            .status
            == Some(TrainingPlanStatus::Active)
    })
    .await;

    // The plan is held to its instance type, its capacity and its zone.
    for (group, expected) in [
        (
            planned_group(
                &net,
                2,
                ClusterInstanceType::MlG548Xlarge,
                &arn,
                Some(&net.subnets[0]),
            ),
            "does not match the instance type ml.p5.48xlarge",
        ),
        (
            planned_group(
                &net,
                3,
                ClusterInstanceType::MlP548Xlarge,
                &arn,
                Some(&net.subnets[0]),
            ),
            "has 2 of 2 available",
        ),
        (
            planned_group(
                &net,
                2,
                ClusterInstanceType::MlP548Xlarge,
                &arn,
                Some(&net.subnets[1]),
            ),
            "is in us-east-1b",
        ),
        (
            // Without an override the cluster's subnets (in two zones) apply.
            planned_group(&net, 2, ClusterInstanceType::MlP548Xlarge, &arn, None),
            "reserves capacity in us-east-1a",
        ),
        (
            planned_group(
                &net,
                1,
                ClusterInstanceType::MlP548Xlarge,
                "arn:aws:sagemaker:us-east-1:123456789012:training-plan/absent",
                Some(&net.subnets[0]),
            ),
            "does not exist",
        ),
    ] {
        let (code, message) = create_refused(&sm, "trained", &eks_arn, &net, group).await;
        assert_eq!(code, "ValidationException");
        assert!(message.contains(expected), "{message}");
    }
    hyperpod_create(&sm, "trained", &eks_arn, &net)
        .instance_groups(planned_group(
            &net,
            2,
            ClusterInstanceType::MlP548Xlarge,
            &arn,
            Some(&net.subnets[0]),
        ))
        .send()
        .await
        .unwrap();
    let plan = sm
        .describe_training_plan()
        .training_plan_name(&arn)
        .send()
        .await
        .unwrap();
    assert_eq!(
        (plan.in_use_instance_count, plan.available_instance_count),
        (Some(2), Some(0))
    );
    let d = sm
        .describe_cluster()
        .cluster_name("trained")
        .send()
        .await
        .unwrap();
    let g = &d.instance_groups()[0];
    assert_eq!(g.training_plan_arn.as_deref(), Some(arn.as_str()));
    assert_eq!(g.training_plan_status.as_deref(), Some("Active"));

    // A Scheduled plan is accepted; its instances wait for the reservation to start.
    let later = sm
        .create_training_plan()
        .training_plan_name("plan-g")
        .training_plan_offering_id("tpo-g")
        .send()
        .await
        .unwrap()
        .training_plan_arn
        .unwrap();
    wait_for("plan Scheduled", || async {
        sm.describe_training_plan()
            .training_plan_name("plan-g")
            .send()
            .await
            .unwrap()
            .status
            == Some(TrainingPlanStatus::Scheduled)
    })
    .await;
    hyperpod_create(&sm, "later", &eks_arn, &net)
        .instance_groups(planned_group(
            &net,
            2,
            ClusterInstanceType::MlG6E48Xlarge,
            &later,
            Some(&net.subnets[0]),
        ))
        .send()
        .await
        .unwrap();
    let nodes = sm
        .list_cluster_nodes()
        .cluster_name("later")
        .send()
        .await
        .unwrap()
        .cluster_node_summaries
        .unwrap();
    assert_eq!(nodes.len(), 2);
    assert!(nodes.iter().all(|n| {
        n.instance_status.as_ref().unwrap().status == Some(ClusterInstanceStatus::Pending)
    }));

    let listed = sm
        .list_training_plans()
        .sort_by(TrainingPlanSortBy::Name)
        .sort_order(TrainingPlanSortOrder::Ascending)
        .send()
        .await
        .unwrap()
        .training_plan_summaries
        .unwrap();
    let names: Vec<&str> = listed
        .iter()
        .filter_map(|p| p.training_plan_name())
        .collect();
    assert_eq!(names, ["plan-a", "plan-g"]);
    let active = sm
        .list_training_plans()
        .filters(
            TrainingPlanFilter::builder()
                .name(TrainingPlanFilterName::Status)
                .value("Active")
                .build(),
        )
        .send()
        .await
        .unwrap()
        .training_plan_summaries
        .unwrap();
    let names: Vec<&str> = active
        .iter()
        .filter_map(|p| p.training_plan_name())
        .collect();
    assert_eq!(names, ["plan-a"]);
    let (code, _) = refused(
        sm.describe_training_plan()
            .training_plan_name("absent")
            .send()
            .await
            .unwrap_err(),
    );
    assert_eq!(code, "ResourceNotFound");
}
