//! The operations engine against a real world (moto + hypd-sim) with `hypd` as a process:
//! plans persisted before calls, idempotency, conflicts, cancel, retry after a provider
//! failure, SIGKILL in each stage, and two replicas on one PostgreSQL database.

use std::time::Duration;

use crate::common::{Postgres, World};
use crate::*;
use reqwest::Method;
use serde_json::{Value, json};

#[test]
fn import_is_planned_first_runs_once_and_repeats_are_the_same_operation() {
    let world = World::start(FAST);
    create_eks(&world, "ml-1");
    let hypd = world.hypd(None, &[]);
    let token = hypd.admin_token();

    // Ten identical requests at once: one operation, one access entry.
    let answers: Vec<(u16, Value)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..10)
            .map(|_| s.spawn(|| import(&hypd, &token, json!({"name": "ml-1"}))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ids: Vec<&str> = answers
        .iter()
        .map(|(status, body)| {
            assert_eq!(*status, 200, "{body}");
            assert_eq!(body["status_command"], "get_operation");
            body["operation_id"].as_str().unwrap()
        })
        .collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    assert_eq!(
        answers.iter().filter(|(_, b)| b["created"] == true).count(),
        1
    );

    let op = hypd.finish(&token, ids[0]);
    assert_eq!(op["state"], "succeeded", "{op}");
    assert_eq!(op["command"], "import_cluster");
    assert_eq!(op["target"], "cluster/ml-1");
    assert!(
        stage_states(&op).iter().all(|(_, s)| s == "succeeded"),
        "{op}"
    );
    assert!(
        op["outputs"]["eks_cluster_arn"]
            .as_str()
            .unwrap()
            .ends_with(":cluster/ml-1")
    );
    let principal = op["outputs"]["principal_arn"].as_str().unwrap().to_owned();
    assert_eq!(op["outputs"]["access_entry_managed"], true);
    assert_eq!(
        access_entries(&world, "ml-1"),
        std::slice::from_ref(&principal)
    );
    assert_eq!(admin_policies(&world, "ml-1", &principal), 1);

    // Every stage ran exactly once, in order, and each transition was recorded.
    let events = transitions(&sqlite_path(&hypd), ids[0]);
    let runs = runs_per_stage(&events);
    for s in ["eks", "access", "hyperpod", "register"] {
        assert_eq!(
            runs.get(&(s.into(), "running".into())),
            Some(&1),
            "{events:?}"
        );
        assert_eq!(
            runs.get(&(s.into(), "succeeded".into())),
            Some(&1),
            "{events:?}"
        );
    }
    assert_eq!(events.first().unwrap().1, "pending");
    assert_eq!(events.last().unwrap(), &(None, "succeeded".to_owned()));

    // The cluster is recorded; importing it again is refused before anything is done.
    let (status, cluster) = hypd.call(&token, Method::GET, "/api/v1/clusters/ml-1", None);
    assert_eq!(status, 200);
    assert_eq!(cluster["status"], "imported");
    let (status, body) = import(&hypd, &token, json!({"name": "ml-1"}));
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["errors"][0]["field"], "name");

    // An unknown EKS cluster is a field error, and no operation is stored for it.
    let (status, body) = import(&hypd, &token, json!({"name": "nope"}));
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"]["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("no EKS cluster named nope")
    );
    let (_, list) = hypd.call(&token, Method::GET, "/api/v1/operations", None);
    assert_eq!(list["operations"].as_array().unwrap().len(), 1, "{list}");
}

#[test]
fn an_idempotency_key_returns_its_operation_and_refuses_another_request() {
    let world = World::start(FAST);
    create_eks(&world, "ml-key");
    create_eks(&world, "ml-other");
    let hypd = world.hypd(None, &[]);
    let token = hypd.admin_token();
    let (_, first) = import(
        &hypd,
        &token,
        json!({"name": "ml-key", "idempotency_key": "agent-run-0001"}),
    );
    let id = first["operation_id"].as_str().unwrap().to_owned();
    assert_eq!(hypd.finish(&token, &id)["state"], "succeeded");
    // After it finished, the same key still names the same operation.
    let (status, again) = import(
        &hypd,
        &token,
        json!({"name": "ml-key", "idempotency_key": "agent-run-0001"}),
    );
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["operation_id"], id.as_str());
    assert_eq!(again["created"], false);
    assert_eq!(again["state"], "succeeded");
    // The key cannot be reused for a different request: another target, or the same
    // target with other values.
    for other in [
        json!({"name": "ml-other", "idempotency_key": "agent-run-0001"}),
        json!({"name": "ml-key", "region": "us-east-1", "idempotency_key": "agent-run-0001"}),
    ] {
        let (status, body) = import(&hypd, &token, other);
        assert_eq!(status, 409, "{body}");
        assert_eq!(body["error"]["kind"], "conflict", "{body}");
        assert_eq!(body["error"]["field"], "idempotency_key", "{body}");
        assert_eq!(body["error"]["operation_id"], id.as_str(), "{body}");
    }
    assert_eq!(access_entries(&world, "ml-key").len(), 1);
    assert!(access_entries(&world, "ml-other").is_empty());
}

#[test]
fn a_busy_target_refuses_other_requests_and_cancel_frees_it() {
    let world = World::start(FAST);
    // The EKS cluster never leaves CREATING while the fault is registered.
    fault(
        &world,
        json!({"service": "eks", "operation": "CreateCluster", "kind": "stuck"}),
    );
    start_eks(&world, "ml-busy");
    let hypd = world.hypd(None, &[]);
    let token = hypd.admin_token();
    let (_, first) = import(&hypd, &token, json!({"name": "ml-busy"}));
    let id = first["operation_id"].as_str().unwrap().to_owned();
    wait_until("the eks stage to wait", Duration::from_secs(30), || {
        stage(&get_op(&hypd, &token, &id), "eks")["state"] == "waiting"
    });
    let op = get_op(&hypd, &token, &id);
    assert_eq!(op["state"], "waiting");
    assert!(
        stage(&op, "eks")["message"]
            .as_str()
            .unwrap()
            .contains("CREATING"),
        "{op}"
    );
    assert!(stage(&op, "eks")["next_poll_at"].is_string());
    assert_eq!(op["cancellable"], true);

    // A different request on the same target: Conflict, naming the running operation.
    let (status, body) = import(
        &hypd,
        &token,
        json!({"name": "ml-busy", "hyperpod_cluster": "hp-1"}),
    );
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["operation_id"], id.as_str());
    assert!(body["error"]["message"].as_str().unwrap().contains(&id));

    let (status, cancelled) = hypd.call(
        &token,
        Method::POST,
        &format!("/api/v1/operations/{id}/cancel"),
        Some(json!({})),
    );
    assert_eq!(status, 200, "{cancelled}");
    let op = hypd.finish(&token, &id);
    assert_eq!(op["state"], "cancelled", "{op}");
    assert!(
        stage_states(&op).iter().all(|(_, s)| s == "cancelled"),
        "{op}"
    );
    assert!(access_entries(&world, "ml-busy").is_empty());
    // Cancelling again is a no-op; retrying a cancelled operation is refused.
    let (status, _) = hypd.call(
        &token,
        Method::POST,
        &format!("/api/v1/operations/{id}/cancel"),
        Some(json!({})),
    );
    assert_eq!(status, 200);
    let (status, body) = hypd.call(
        &token,
        Method::POST,
        &format!("/api/v1/operations/{id}/retry"),
        Some(json!({})),
    );
    assert_eq!(status, 422, "{body}");

    // The target is free again.
    let (status, second) = import(&hypd, &token, json!({"name": "ml-busy"}));
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["created"], true);
    assert_ne!(second["operation_id"], id.as_str());
}

#[test]
fn a_provider_failure_is_kept_and_retry_finishes_without_duplicates() {
    let world = World::start(FAST);
    create_eks(&world, "ml-retry");
    fault(
        &world,
        json!({"service": "eks", "operation": "AssociateAccessPolicy", "kind": "error",
               "code": "AccessDeniedException", "status": 403,
               "message": "User is not authorized to perform eks:AssociateAccessPolicy"}),
    );
    let hypd = world.hypd(None, &[]);
    let token = hypd.admin_token();
    let (_, first) = import(&hypd, &token, json!({"name": "ml-retry"}));
    let id = first["operation_id"].as_str().unwrap().to_owned();
    let op = hypd.finish(&token, &id);
    assert_eq!(op["state"], "failed", "{op}");
    assert_eq!(op["retryable"], true);
    let failed = stage(&op, "access");
    assert_eq!(failed["state"], "failed");
    let err = &failed["error"];
    assert_eq!(err["kind"], "upstream", "{err}");
    assert_eq!(err["service"], "eks");
    assert_eq!(err["call"], "AssociateAccessPolicy");
    assert_eq!(err["code"], "AccessDeniedException");
    assert!(err["message"].as_str().unwrap().contains("not authorized"));
    assert!(err["request_id"].is_string(), "{err}");
    assert_eq!(op["error"], *err);
    assert_eq!(stage(&op, "eks")["state"], "succeeded");
    assert_eq!(stage(&op, "hyperpod")["state"], "pending");
    // The entry was made before the failing call.
    assert_eq!(access_entries(&world, "ml-retry").len(), 1);

    let (status, retried) = hypd.call(
        &token,
        Method::POST,
        &format!("/api/v1/operations/{id}/retry"),
        Some(json!({})),
    );
    assert_eq!(status, 200, "{retried}");
    assert_eq!(retried["operation_id"], id.as_str());
    let op = hypd.finish(&token, &id);
    assert_eq!(op["state"], "succeeded", "{op}");
    assert!(op["error"].is_null());
    assert_eq!(stage(&op, "access")["attempts"], 2);
    assert_eq!(
        stage(&op, "eks")["attempts"],
        1,
        "succeeded stages are not repeated"
    );
    let entries = access_entries(&world, "ml-retry");
    assert_eq!(entries.len(), 1);
    assert_eq!(admin_policies(&world, "ml-retry", &entries[0]), 1);
}

/// A stage running when hypd dies runs again after the restart, and says so: its
/// attempts count the interrupted run and the trail records the resumption.
#[test]
fn a_stage_interrupted_while_running_counts_another_attempt() {
    let world = World::start(FAST);
    create_eks(&world, "resumed");
    let hold = fault(
        &world,
        json!({"service": "eks", "operation": "AssociateAccessPolicy", "kind": "delay", "seconds": 30}),
    );
    let hypd = world.hypd(None, &[]);
    let token = hypd.admin_token();
    let (_, first) = import(&hypd, &token, json!({"name": "resumed"}));
    let id = first["operation_id"].as_str().unwrap().to_owned();
    wait_until("the access stage to run", Duration::from_secs(60), || {
        stage(&get_op(&hypd, &token, &id), "access")["state"] == "running"
    });
    std::thread::sleep(Duration::from_millis(500));
    let data_dir = hypd.kill();
    world
        .sim
        .call(Method::DELETE, &format!("/_sim/faults/{hold}"), None);
    let hypd = world.hypd(Some(data_dir), &[]);
    let op = hypd.finish(&token, &id);
    assert_eq!(op["state"], "succeeded", "{op:#}");
    let access = stage(&op, "access");
    assert_eq!(access["attempts"], 2, "{access}");
    let events = transitions(&sqlite_path(&hypd), &id);
    let runs = runs_per_stage(&events);
    assert_eq!(
        runs.get(&("access".into(), "running".into())),
        Some(&2),
        "{events:?}"
    );
    // The stage before it is not run again.
    assert_eq!(
        runs.get(&("eks".into(), "running".into())),
        Some(&1),
        "{events:?}"
    );
    assert_eq!(access_entries(&world, "resumed").len(), 1);
}

#[test]
fn two_replicas_on_one_postgres_run_every_stage_once() {
    let pg = Postgres::start();
    let world = World::start(FAST);
    let names: Vec<String> = (0..8).map(|i| format!("pg-{i}")).collect();
    for n in &names {
        create_eks(&world, n);
    }
    let a = world.hypd(None, &[("HYPD_DATABASE_URL", &pg.url)]);
    let token = a.admin_token();
    let b = world.hypd(None, &[("HYPD_DATABASE_URL", &pg.url)]);
    let ids: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let replica = if i % 2 == 0 { &a } else { &b };
            let (status, body) = import(replica, &token, json!({"name": n}));
            assert_eq!(status, 200, "{body}");
            body["operation_id"].as_str().unwrap().to_owned()
        })
        .collect();
    for id in &ids {
        let op = b.finish(&token, id);
        assert_eq!(op["state"], "succeeded", "{op}");
        let runs = runs_per_stage(&transitions(&pg.url, id));
        for s in ["eks", "access", "hyperpod", "register"] {
            assert_eq!(
                runs.get(&(s.into(), "running".into())),
                Some(&1),
                "{id}: {runs:?}"
            );
            assert_eq!(
                runs.get(&(s.into(), "succeeded".into())),
                Some(&1),
                "{id}: {runs:?}"
            );
        }
    }
    for n in &names {
        assert_eq!(access_entries(&world, n).len(), 1, "{n}");
    }
}

/// Ten identical creates split over a warm replica and a freshly started one get one
/// operation, whatever the timing (before: the fresh replica's slow pre-flight found
/// the cluster the winner had meanwhile recorded, and answered "name taken").
#[test]
fn identical_creates_across_replicas_are_one_operation() {
    let pg = Postgres::start();
    let world = World::start_checked(FAST);
    let warm = world.hypd(None, &[("HYPD_DATABASE_URL", &pg.url)]);
    let token = warm.admin_token();
    let (status, _) = warm.call(
        &token,
        Method::GET,
        "/api/v1/instance-types?availability_zone=us-east-1a",
        None,
    );
    assert_eq!(status, 200);
    let fresh = world.hypd(None, &[("HYPD_DATABASE_URL", &pg.url)]);
    let body = crate::common::cluster::small("twin");
    let ids: Vec<String> = std::thread::scope(|s| {
        let calls: Vec<_> = (0..10)
            .map(|i| {
                let (replica, token, body) = (
                    if i % 2 == 0 { &warm } else { &fresh },
                    &token,
                    body.clone(),
                );
                s.spawn(move || {
                    let (status, answer) =
                        replica.call(token, Method::POST, "/api/v1/clusters", Some(body));
                    assert_eq!(status, 200, "{answer}");
                    answer["operation_id"].as_str().unwrap().to_owned()
                })
            })
            .collect();
        calls.into_iter().map(|c| c.join().unwrap()).collect()
    });
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    let op = warm.finish(&token, &ids[0]);
    assert_eq!(op["state"], "succeeded", "{op:#}");
}
