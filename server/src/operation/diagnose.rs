//! `diagnose_operation`: why an operation failed or waits, from its stored stages and
//! the plan of what its stages left would change now, with the next commands as
//! suggestions. It reads only (the plan is computed with every mutating call refused),
//! so an agent may call it on its own; what it suggests, the user approves.

use app::api::ApiError;
use app::api::diagnose::{DiagnoseOperation, Diagnosis, Finding, Severity, Suggestion};
use app::api::operations::{Operation, OperationState, Stage};
use app::api::plan::{Action, Plan};
use serde_json::json;

use super::control;
use crate::auth::Actor;
use crate::service::{Handler, Service};

impl Handler<DiagnoseOperation> for Service {
    async fn handle(&self, actor: &Actor, r: DiagnoseOperation) -> Result<Diagnosis, ApiError> {
        let op = super::get(&self.store, &r.operation_id)
            .await?
            .ok_or_else(|| ApiError::NotFound {
                resource: "operation".into(),
                name: r.operation_id.clone(),
            })?;
        let remaining = if op.state == OperationState::Failed && op.retryable {
            Some(control::retry_plan(&self.preflight(), actor, &op.operation_id).await)
        } else {
            None
        };
        Ok(diagnose(&op, remaining))
    }
}

/// What a provider's refusal says about its cause, read from its code.
#[derive(Debug, PartialEq)]
enum Cause {
    /// hypd's identity may not make the call.
    Permission,
    /// A quota, a limit or the provider's capacity.
    Capacity,
    /// The provider may answer otherwise later.
    Transient,
    /// Something the stage relies on is gone (deleted outside hypd).
    Gone,
    /// The provider refuses the request as made: asking again repeats it.
    Invalid,
    /// Another operation holds the target.
    Busy(String),
    Other,
}

fn cause(error: &ApiError) -> Cause {
    let code = match error {
        ApiError::Conflict {
            operation_id: Some(id),
            ..
        } => return Cause::Busy(id.clone()),
        ApiError::Validation { .. } | ApiError::Immutable { .. } => return Cause::Invalid,
        ApiError::Unavailable { .. } | ApiError::RateLimited { .. } => return Cause::Transient,
        ApiError::Upstream {
            transient: true, ..
        } => return Cause::Transient,
        ApiError::Upstream { code: Some(c), .. } => c.as_str(),
        _ => return Cause::Other,
    };
    let any = |words: &[&str]| words.iter().any(|w| code.contains(w));
    if any(&["AccessDenied", "Unauthorized", "Forbidden", "NotAuthorized"]) {
        Cause::Permission
    } else if any(&[
        "LimitExceeded",
        "QuotaExceeded",
        "InsufficientInstanceCapacity",
    ]) || any(&["InsufficientCapacity", "CapacityError"])
    {
        Cause::Capacity
    } else if any(&["NotFound", "NoSuch"]) {
        Cause::Gone
    } else if any(&[
        "Validation",
        "InvalidParameter",
        "InvalidRequest",
        "Invalid",
    ]) {
        Cause::Invalid
    } else {
        Cause::Other
    }
}

/// The cluster an operation acts on, when it acts on one (`cluster/<name>[/…]`).
fn cluster_of(op: &Operation) -> Option<&str> {
    op.target
        .strip_prefix("cluster/")
        .and_then(|rest| rest.split('/').next())
        .filter(|n| !n.is_empty())
}

/// The stage a failure or a wait is about.
fn current(op: &Operation) -> Option<&Stage> {
    op.stages
        .iter()
        .find(|s| s.state == OperationState::Failed)
        .or_else(|| op.current_stage())
}

fn evidence(error: &ApiError) -> Option<String> {
    match error {
        ApiError::Upstream {
            message,
            request_id,
            ..
        } => Some(match request_id {
            Some(id) => format!("{message} (request id {id})"),
            None => message.clone(),
        }),
        _ => None,
    }
}

/// The diagnosis of `op`, given the plan of its stages left (for a failed operation
/// that can be retried). Pure: the handler reads, this decides.
pub fn diagnose(op: &Operation, remaining: Option<Result<Plan, ApiError>>) -> Diagnosis {
    let id = op.operation_id.as_str();
    let mut findings = Vec::new();
    let mut suggestions = Vec::new();
    let stage = current(op);
    let at = stage
        .map(|s| format!(" at stage `{}` ({})", s.name, s.title))
        .unwrap_or_default();
    match op.state {
        OperationState::Succeeded => findings.push(Finding {
            severity: Severity::Info,
            summary: format!(
                "{} on {} succeeded: nothing to diagnose",
                op.command, op.target
            ),
            evidence: op.note.clone(),
        }),
        OperationState::Cancelled => findings.push(Finding {
            severity: Severity::Info,
            summary: format!(
                "{} on {} was cancelled{at}; what the stages before it made is kept",
                op.command, op.target
            ),
            evidence: None,
        }),
        OperationState::Pending | OperationState::Running | OperationState::Waiting => {
            let attempts = stage.map_or(0, |s| s.attempts);
            findings.push(Finding {
                severity: Severity::Info,
                summary: format!(
                    "{} on {} is {}{at}, looked at {attempts} time(s)",
                    op.command,
                    op.target,
                    op.state.as_str()
                ),
                evidence: stage.and_then(|s| s.message.clone()),
            });
            // A stage waiting out a transient failure keeps the last one.
            if let Some(error) = stage.and_then(|s| s.error.as_ref()) {
                findings.push(Finding {
                    severity: Severity::Warning,
                    summary: format!("the last attempt failed and will be tried again: {error}"),
                    evidence: evidence(error),
                });
            }
            suggestions.push(Suggestion::new(
                "wait_operation",
                json!({ "operation_id": id }),
                "it is still in progress: follow it to a final state",
            ));
        }
        OperationState::Failed => {
            failed(op, stage, &at, &mut findings, &mut suggestions);
        }
    }
    let remaining = match remaining {
        Some(Ok(plan)) => {
            findings.push(left(&plan));
            Some(plan)
        }
        Some(Err(e)) => {
            findings.push(Finding {
                severity: Severity::Warning,
                summary: format!("what the stages left would change cannot be read now: {e}"),
                evidence: evidence(&e),
            });
            None
        }
        None => None,
    };
    // Stable: within a severity, the order they were found in.
    findings.sort_by_key(|f| std::cmp::Reverse(f.severity));
    Diagnosis {
        subject: format!("operation/{id}"),
        findings,
        suggestions,
        remaining,
    }
}

/// What retrying would do, in one sentence: the changes by action and kind.
fn left(plan: &Plan) -> Finding {
    let mut counts: std::collections::BTreeMap<(&str, &str), usize> = Default::default();
    for c in plan.changes().filter(|c| c.action != Action::None) {
        *counts
            .entry((c.action.as_str(), c.kind.as_str()))
            .or_default() += 1;
    }
    let summary = if counts.is_empty() {
        "retrying would change nothing: what the stages left are to make is already there".into()
    } else {
        let said: Vec<String> = counts
            .iter()
            .map(|((action, kind), n)| format!("{action} {n} {kind}"))
            .collect();
        format!("retrying would {}", said.join(", "))
    };
    Finding {
        severity: Severity::Info,
        summary,
        evidence: None,
    }
}

/// The findings and suggestions of a failed operation, by the cause its error names.
fn failed(
    op: &Operation,
    stage: Option<&Stage>,
    at: &str,
    findings: &mut Vec<Finding>,
    suggestions: &mut Vec<Suggestion>,
) {
    let id = op.operation_id.as_str();
    let error = stage.and_then(|s| s.error.as_ref()).or(op.error.as_ref());
    findings.push(Finding {
        severity: Severity::Error,
        summary: match error {
            Some(e) => format!("{} on {} failed{at}: {e}", op.command, op.target),
            None => format!("{} on {} failed{at}", op.command, op.target),
        },
        evidence: error.and_then(evidence),
    });
    let cause = error.map_or(Cause::Other, cause);
    let stage_name = stage.map_or("", |s| s.name.as_str());
    let retry = |why: String| {
        Suggestion::new(
            "retry_operation",
            json!({ "operation_id": id }),
            format!(
                "{why}; it resumes at `{stage_name}` without repeating the stages done (preview it with dry_run first)"
            ),
        )
    };
    let call = match error {
        Some(ApiError::Upstream { service, call, .. }) => format!("{service}.{call}"),
        _ => "the call".into(),
    };
    match cause {
        Cause::Permission => {
            findings.push(Finding {
                severity: Severity::Warning,
                summary: format!(
                    "hypd's identity is not allowed to make {call}: the role or access entry hypd runs as needs that permission"
                ),
                evidence: None,
            });
            if op.retryable {
                suggestions.push(retry(format!(
                    "once an administrator grants hypd {call}"
                )));
            }
        }
        Cause::Capacity => {
            findings.push(Finding {
                severity: Severity::Warning,
                summary: "a quota, a limit or the provider's capacity stopped it: a higher quota, another instance type or zone, or fewer instances".into(),
                evidence: None,
            });
            suggestions.push(Suggestion::new("list_instance_types", json!({}), "to see the types offered, and their quotas, before choosing",
            ));
            if op.retryable {
                suggestions.push(retry("once the quota is raised or capacity is back".into()));
            }
        }
        Cause::Transient => {
            if op.retryable {
                suggestions.push(retry("the failure is transient on the provider's side".into()));
            }
        }
        Cause::Gone => {
            findings.push(Finding {
                severity: Severity::Warning,
                summary: "something the stage relies on is gone, most likely deleted outside hypd".into(),
                evidence: None,
            });
            if let Some(cluster) = cluster_of(op) {
                suggestions.push(Suggestion::new("get_drift", json!({ "name": cluster }), "to see what differs from what hypd made",
                ));
            }
            if op.retryable {
                suggestions.push(retry("the stage observes first and makes again what is missing".into()));
            }
        }
        Cause::Invalid => findings.push(Finding {
            severity: Severity::Warning,
            summary: "the request itself was refused: retrying repeats it; start again with corrected input".into(),
            evidence: None,
        }),
        Cause::Busy(other) => {
            suggestions.push(Suggestion::new("wait_operation", json!({ "operation_id": other }), "another operation holds the target: let it end first",
            ));
            if op.retryable {
                suggestions.push(retry("once the other operation has ended".into()));
            }
        }
        Cause::Other => {
            if op.retryable {
                suggestions.push(retry("if the error above is resolved".into()));
            }
        }
    }
    // The last resort, for a cluster half made: what its stages made, deleted.
    if op.command == "create_cluster"
        && let Some(cluster) = cluster_of(op)
    {
        suggestions.push(Suggestion::new("delete_cluster", json!({ "name": cluster }), "only if the user gives the cluster up: deletes what the stages made (its first call answers with the plan and a confirmation)",
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use app::api::command::Effect;
    use serde_json::Value;

    fn op(command: &str, state: &str, stage_state: &str, error: Value) -> Operation {
        serde_json::from_value(json!({
            "operation_id": "op-1", "command": command, "target": "cluster/ml-1",
            "state": state, "requested_by": "admin", "created_at": "t0", "updated_at": "t1",
            "stages": [
                { "name": "network", "title": "Network", "state": "succeeded", "attempts": 1,
                  "started_at": null, "finished_at": null, "next_poll_at": null,
                  "message": null, "error": null, "cancellable": true },
                { "name": "nodes", "title": "Nodes", "state": stage_state, "attempts": 3,
                  "started_at": null, "finished_at": null, "next_poll_at": null,
                  "message": "2 of 4 nodes Running", "error": error, "cancellable": true },
            ],
            "outputs": {}, "error": if state == "failed" { error.clone() } else { Value::Null },
            "retryable": state == "failed", "cancellable": false,
        }))
        .unwrap()
    }

    fn upstream(code: &str, transient: bool) -> Value {
        json!({ "kind": "upstream", "service": "sagemaker", "call": "CreateCluster", "code": code,
                "message": "refused", "request_id": "req-9", "transient": transient })
    }

    #[test]
    fn a_refused_permission_is_retried_once_granted_and_nothing_else_is_suggested() {
        let d = diagnose(
            &op(
                "import_cluster",
                "failed",
                "failed",
                upstream("AccessDeniedException", false),
            ),
            None,
        );
        assert_eq!(d.subject, "operation/op-1");
        assert_eq!(d.findings[0].severity, Severity::Error);
        assert!(d.findings[0].summary.contains("at stage `nodes`"), "{d:?}");
        assert!(
            d.findings[0].summary.contains("AccessDeniedException"),
            "{d:?}"
        );
        assert_eq!(
            d.findings[0].evidence.as_deref(),
            Some("refused (request id req-9)")
        );
        assert!(d.findings[1].summary.contains("sagemaker.CreateCluster"));
        assert_eq!(d.suggested(), [("retry_operation", Effect::Mutating)]);
        assert_eq!(d.suggestions[0].arguments["operation_id"], "op-1");
    }

    #[test]
    fn a_cluster_short_of_quota_escalates_from_reading_to_retrying_to_deleting() {
        let d = diagnose(
            &op(
                "create_cluster",
                "failed",
                "failed",
                upstream("ResourceLimitExceeded", false),
            ),
            None,
        );
        assert_eq!(
            d.suggested(),
            [
                ("list_instance_types", Effect::ReadOnly),
                ("retry_operation", Effect::Mutating),
                ("delete_cluster", Effect::Destructive),
            ]
        );
        assert_eq!(d.suggestions[2].arguments["name"], "ml-1");
    }

    #[test]
    fn a_request_the_provider_calls_invalid_is_not_offered_a_retry() {
        let d = diagnose(
            &op(
                "import_cluster",
                "failed",
                "failed",
                upstream("ValidationException", false),
            ),
            None,
        );
        assert!(d.suggested().is_empty(), "{d:?}");
        assert!(d.findings[1].summary.contains("retrying repeats it"));
    }

    #[test]
    fn a_stage_waiting_out_a_transient_failure_is_followed_not_retried() {
        let d = diagnose(
            &op(
                "create_cluster",
                "waiting",
                "waiting",
                upstream("ThrottlingException", true),
            ),
            None,
        );
        assert_eq!(d.findings[0].severity, Severity::Warning);
        assert_eq!(
            d.findings[1].evidence.as_deref(),
            Some("2 of 4 nodes Running")
        );
        assert_eq!(d.suggested(), [("wait_operation", Effect::ReadOnly)]);
    }

    #[test]
    fn what_a_retry_would_change_is_counted_by_action_and_kind() {
        let plan: Plan = serde_json::from_value(json!({
            "command": "create_cluster", "target": "cluster/ml-1",
            "stages": [{ "stage": "nodes", "title": "Nodes", "changes": [
                { "action": "create", "kind": "sagemaker:Cluster", "name": "ml-1" },
                { "action": "none", "kind": "eks:Cluster", "name": "ml-1" },
            ] }],
        }))
        .unwrap();
        let d = diagnose(
            &op(
                "create_cluster",
                "failed",
                "failed",
                upstream("InternalFailure", true),
            ),
            Some(Ok(plan)),
        );
        let said: Vec<&str> = d.findings.iter().map(|f| f.summary.as_str()).collect();
        assert!(
            said.contains(&"retrying would create 1 sagemaker:Cluster"),
            "{said:?}"
        );
        assert!(d.remaining.is_some());
        assert_eq!(d.suggested()[0], ("retry_operation", Effect::Mutating));
    }

    #[test]
    fn a_finished_operation_has_nothing_to_suggest() {
        let d = diagnose(
            &op("create_cluster", "succeeded", "succeeded", Value::Null),
            None,
        );
        assert!(d.suggestions.is_empty());
        assert!(d.findings[0].summary.contains("nothing to diagnose"));
    }
}
