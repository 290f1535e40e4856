//! The cluster page's Training tab: the jobs `list_training_jobs` finds and the cluster's
//! MLflow tracking server (or the form that makes it), one job's pods, conditions,
//! recovery ledger and MLflow runs (`get_training_job`) with their metrics charted
//! (`get_training_job_metrics`), and the submit form. The form asks `check_training_job`
//! first and shows every verdict, then the plan (the job's spec as it will be applied),
//! then runs it: the same checks, plan and operation an agent gets.

use leptos::either::Either;
use leptos::prelude::*;

use super::diagnosis::DiagnosisView;
use super::gate::{Gate, integer, text};
use super::{StateBadge, Table, loading};
use crate::api::ApiError;
use crate::api::call::call;
use crate::api::command::Role;
use crate::api::diagnose::{DiagnoseTrainingJob, Diagnosis};
use crate::api::mlflow::{CreateMlflowTrackingServer, TrackingServer};
use crate::api::training::{
    CheckTrainingJob, GetTrainingJob, GetTrainingJobMetrics, JobTracking, ListTrainingJobs,
    MetricSeries, SubmitTrainingJob, TrainingChecks, TrainingJob, TrainingJobList,
};
use crate::api::values::{EksClusterName, JobName};
use crate::form::{check, request};
use crate::session::{ErrorPanel, IfRole};

#[component]
pub fn TrainingPanel(
    name: String,
    /// The cluster is active or imported: only then are there jobs to read.
    usable: Signal<bool>,
) -> impl IntoView {
    let cluster = StoredValue::new(name);
    let reads = RwSignal::new(0u32);
    let shown_job = RwSignal::new(None::<String>);
    let listed = Resource::new(
        move || reads.get(),
        move |n| async move {
            if n == 0 {
                return None;
            }
            Some(match EksClusterName::parse(&cluster.get_value()) {
                Ok(name) => call(&ListTrainingJobs { name }).await,
                Err(m) => Err(ApiError::field("name", m)),
            })
        },
    );
    Effect::new(move || {
        if usable.get() && reads.get_untracked() == 0 {
            reads.set(1);
        }
    });
    let shown = move || {
        Suspend::new(async move {
            match listed.await {
                None => Either::Left(view! {
                    <p class="muted">"Read from the cluster once it is active."</p>
                }),
                Some(Ok(list)) => {
                    let server = list.mlflow.clone();
                    Either::Right(Either::Left(view! {
                        <Jobs list shown_job/>
                        <Tracking cluster=cluster.get_value() server/>
                    }))
                }
                Some(Err(error)) => Either::Right(Either::Right(view! { <ErrorPanel error/> })),
            }
        })
    };
    view! {
        <div class="panel training" aria-labelledby="training-title">
            <h2 id="training-title">"Training jobs"</h2>
            <Transition fallback=loading>{shown}</Transition>
            <div class="actions">
                <button type="button" class="refresh-training" on:click=move |_| reads.update(|n| *n += 1)>
                    "Refresh"
                </button>
            </div>
        </div>
        {move || shown_job.get().map(|job| view! { <JobDetail cluster=cluster.get_value() job/> })}
        <IfRole role=Role::Operator>
            <Submit cluster=cluster.get_value()/>
        </IfRole>
    }
    .into_any()
}

/// The cluster's MLflow tracking server, or (for an operator) the form that makes it.
#[component]
fn Tracking(cluster: String, server: Option<TrackingServer>) -> impl IntoView {
    match server {
        Some(s) => {
            let link = s.url.clone().filter(|_| s.up());
            Either::Left(view! {
                <p class="mlflow-server">
                    "MLflow: "<span class="mono">{s.name}</span>" "<StateBadge state=s.status/>
                    {link.map(|url| view! { " " <a href=url target="_blank" rel="noopener">"Open MLflow"</a> })}
                </p>
            })
        }
        None => Either::Right(view! {
            <IfRole role=Role::Operator>
                <CreateTracking cluster=cluster.clone()/>
            </IfRole>
        }),
    }
}

#[component]
fn CreateTracking(cluster: String) -> impl IntoView {
    let gate = Gate::default();
    let size = RwSignal::new("Small".to_owned());
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        gate.start::<CreateMlflowTrackingServer>(&[
            text("name", cluster.clone()),
            text("size", size.get_untracked()),
        ]);
    };
    view! {
        <form class="create-mlflow" aria-label="Create an MLflow tracking server" on:submit=submit>
            <p class="muted">"No MLflow tracking server: jobs report nowhere."</p>
            <label>"Size "
                <select name="size" on:change=gate.edit(size) prop:value=move || size.get()>
                    <option value="Small">"Small (up to 25 users)"</option>
                    <option value="Medium">"Medium (50)"</option>
                    <option value="Large">"Large (100)"</option>
                </select>
            </label>
            <button class="primary" type="submit" disabled=move || gate.busy()>
                {move || if gate.reviewing() { "Create tracking server" } else { "Review plan" }}
            </button>
            {gate.view()}
        </form>
    }
}

#[component]
fn Jobs(list: TrainingJobList, shown_job: RwSignal<Option<String>>) -> impl IntoView {
    if list.jobs.is_empty() {
        return Either::Left(view! { <p class="muted empty-training">"No training job yet."</p> });
    }
    let rows = list
        .jobs
        .into_iter()
        .map(|j| {
            let id = j.job.clone();
            let open = j.job.clone();
            view! {
                <tr data-job=id>
                    <th scope="row" class="mono">{j.job}</th>
                    <td>{j.recipe}</td>
                    <td><StateBadge state=j.phase/></td>
                    <td>{j.instance_group.unwrap_or_else(|| "—".into())}</td>
                    <td class="num">{j.nodes}</td>
                    <td class="num attempt">{j.attempt}</td>
                    <td>
                        <button type="button" class="show-job" on:click=move |_| shown_job.set(Some(open.clone()))>
                            "Show"
                        </button>
                    </td>
                </tr>
            }
        })
        .collect_view();
    Either::Right(view! {
        <Table class="job-table" caption="Training jobs" columns={&["Job", "Recipe", "Phase", "Group", "Nodes", "Attempt", ""]}>
            {rows}
        </Table>
    })
}

/// The cluster and job a read of one job names.
fn job_of(cluster: &str, job: &str) -> Result<(EksClusterName, JobName), ApiError> {
    Ok((
        EksClusterName::parse(cluster).map_err(|m| ApiError::field("name", m))?,
        JobName::parse(job).map_err(|m| ApiError::field("job", m))?,
    ))
}

/// One job: its pods and their nodes, the recovery ledger, conditions.
#[component]
fn JobDetail(cluster: String, job: String) -> impl IntoView {
    let reads = RwSignal::new(0u32);
    let cluster = StoredValue::new(cluster);
    let job = StoredValue::new(job);
    let got = Resource::new(
        move || reads.get(),
        move |_| async move {
            let (name, job) = job_of(&cluster.get_value(), &job.get_value())?;
            call(&GetTrainingJob { name, job }).await
        },
    );
    // What ails the job, on demand: it reads every pod's log.
    let found = RwSignal::new(None::<Result<Diagnosis, ApiError>>);
    let diagnosing = RwSignal::new(false);
    let diagnose = move |_| {
        diagnosing.set(true);
        leptos::task::spawn_local(async move {
            let answer = match job_of(&cluster.get_value(), &job.get_value()) {
                Ok((name, job)) => call(&DiagnoseTrainingJob { name, job }).await,
                Err(e) => Err(e),
            };
            found.set(Some(answer));
            diagnosing.set(false);
        });
    };
    let shown = move || {
        Suspend::new(async move {
            match got.await {
                Ok(j) => Either::Left(view! { <Detail cluster=cluster.get_value() j/> }),
                Err(error) => Either::Right(view! { <ErrorPanel error/> }),
            }
        })
    };
    view! {
        <div class="panel job-detail" data-job=job.get_value() aria-label="Training job">
            <h2>{format!("Job {}", job.get_value())}</h2>
            <Transition fallback=loading>{shown}</Transition>
            <div class="actions">
                <button type="button" class="refresh-job" on:click=move |_| reads.update(|n| *n += 1)>"Refresh"</button>
                <button type="button" class="diagnose-job" on:click=diagnose disabled=move || diagnosing.get()>"Diagnose"</button>
            </div>
            {move || found.get().map(|answer| match answer {
                Ok(found) => Either::Left(view! { <DiagnosisView found/> }),
                Err(error) => Either::Right(view! { <ErrorPanel error/> }),
            })}
        </div>
    }
}

#[component]
fn Detail(cluster: String, j: TrainingJob) -> impl IntoView {
    let ledger = j.recovery;
    let tracking = j.mlflow;
    let metrics_for = (cluster.clone(), j.summary.job.clone());
    let pod_names: Vec<String> = j.pods.iter().map(|p| p.pod.clone()).collect();
    let job_name = j.summary.job.clone();
    let pods = j
        .pods
        .into_iter()
        .map(|p| {
            let id = p.pod.clone();
            view! {
                <tr data-pod=id>
                    <th scope="row" class="mono">{p.pod}</th>
                    <td><StateBadge state=p.phase/></td>
                    <td class="mono">{p.node.unwrap_or_else(|| "—".into())}</td>
                    <td>{p.waiting.unwrap_or_default()}</td>
                </tr>
            }
        })
        .collect_view();
    let spent = !ledger.entries.is_empty();
    let entries = ledger
        .entries
        .into_iter()
        .map(|e| {
            view! {
                <tr data-attempt=e.attempt>
                    <td class="num">{e.attempt}</td>
                    <td>{e.at.unwrap_or_default()}</td>
                    <td>{e.action}</td>
                    <td class="mono">{e.pod.unwrap_or_default()}</td>
                    <td class="mono">{e.node.unwrap_or_default()}</td>
                    <td class="num">{e.exit_code.map(|c| c.to_string()).unwrap_or_else(|| e.log_rule.unwrap_or_default())}</td>
                </tr>
            }
        })
        .collect_view();
    let left = |n: Option<u32>| n.map_or_else(|| "—".to_owned(), |n| n.to_string());
    view! {
        <p class="job-phase">
            <StateBadge state=j.summary.phase/>
            {format!(" attempt {} on {} · image {}", j.summary.attempt,
                j.summary.instance_group.unwrap_or_else(|| "—".into()), j.image.unwrap_or_else(|| "—".into()))}
        </p>
        <Table class="pod-table" caption="Pods" columns={&["Pod", "Phase", "Node", "Waiting"]}>{pods}</Table>
        <LogPane cluster job=job_name pods=pod_names/>
        <h3>"Recovery budget"</h3>
        <dl class="ledger">
            <dt>"Restarts used"</dt><dd class="restarts-used">{ledger.restarts_used}</dd>
            <dt>"Restarts left"</dt><dd class="restarts-left">{left(ledger.restarts_left)}</dd>
            <dt>"In this period"</dt><dd>{ledger.restarts_in_period}</dd>
            <dt>"Full-job restarts"</dt><dd>{format!("{} used, {} left", ledger.full_job_restarts_used, left(ledger.full_job_restarts_left))}</dd>
            <dt>"On the next failure"</dt><dd class="next-failure">{ledger.next_failure}</dd>
        </dl>
        {if spent {
            Either::Left(view! {
                <Table class="ledger-table" caption="What used the budget" columns={&["Attempt", "When", "Action", "Pod", "Node", "Exit code or rule"]}>
                    {entries}
                </Table>
            })
        } else {
            Either::Right(view! { <p class="muted unspent">"Nothing has used the budget yet."</p> })
        }}
        {tracking.map(|t| view! { <Runs t/> <Metrics cluster=metrics_for.0 job=metrics_for.1/> })}
    }
}

/// Where the job reports in MLflow, and its runs with their attempts.
#[component]
fn Runs(t: JobTracking) -> impl IntoView {
    let rows = t
        .runs
        .into_iter()
        .map(|r| {
            let link = r.link.clone().unwrap_or_default();
            let id = r.run_id.clone();
            view! {
                <tr data-run=id>
                    <td class="num">{r.attempt.map(|a| a.to_string()).unwrap_or_default()}</td>
                    <td><a href=link target="_blank" rel="noopener" class="mono">{r.name.unwrap_or(r.run_id)}</a></td>
                    <td><StateBadge state=r.status/></td>
                    <td>{r.started_at.unwrap_or_default()}</td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <h3>"MLflow"</h3>
        <p class="mlflow-experiment">
            {format!("Experiment {} on ", t.experiment)}<span class="mono">{t.tracking_server}</span>
            {t.url.map(|u| view! { " " <a href=u target="_blank" rel="noopener">"Open"</a> })}
        </p>
        {t.error.map(|e| view! { <p class="error">{e}</p> })}
        <Table class="run-table" caption="Runs (one per attempt)" columns={&["Attempt", "Run", "Status", "Started"]}>{rows}</Table>
    }
}

/// The job's metrics, one chart per metric with a line per run, refreshed on demand.
#[component]
fn Metrics(cluster: String, job: String) -> impl IntoView {
    let reads = RwSignal::new(0u32);
    let cluster = StoredValue::new(cluster);
    let job = StoredValue::new(job);
    let got = Resource::new(
        move || reads.get(),
        move |_| async move {
            let (name, job) = job_of(&cluster.get_value(), &job.get_value())?;
            call(&GetTrainingJobMetrics {
                name,
                job,
                metrics: Vec::new(),
                max_points: None,
            })
            .await
        },
    );
    let shown = move || {
        Suspend::new(async move {
            match got.await {
                Ok(m) if m.series.is_empty() => Either::Left(
                    view! {
                        <p class="muted no-metrics">"No metrics reported yet."</p>
                    }
                    .into_any(),
                ),
                Ok(m) => {
                    let mut keys: Vec<String> = m.series.iter().map(|s| s.key.clone()).collect();
                    keys.sort();
                    keys.dedup();
                    Either::Left(
                        keys.into_iter()
                            .map(|key| {
                                let lines: Vec<MetricSeries> =
                                    m.series.iter().filter(|s| s.key == key).cloned().collect();
                                view! { <Chart key lines/> }
                            })
                            .collect_view()
                            .into_any(),
                    )
                }
                Err(error) => Either::Right(view! { <ErrorPanel error/> }),
            }
        })
    };
    view! {
        <div class="metrics" aria-label="Metrics">
            <Transition fallback=loading>{shown}</Transition>
            <button type="button" class="refresh-metrics" on:click=move |_| reads.update(|n| *n += 1)>"Refresh metrics"</button>
        </div>
    }
}

/// A metric's value as a person reads it: small ones (a learning rate) in exponent form.
fn shown(v: f64) -> String {
    if v != 0.0 && v.abs() < 0.01 {
        format!("{v:.2e}")
    } else {
        format!("{v:.4}")
    }
}

const CHART_W: f64 = 420.0;
const CHART_H: f64 = 140.0;

/// One metric as a line chart: steps across, values up, a line per run (attempt).
#[component]
fn Chart(key: String, lines: Vec<MetricSeries>) -> impl IntoView {
    let points = lines.iter().flat_map(|l| l.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (i64::MAX, i64::MIN, f64::MAX, f64::MIN);
    for (x, y) in points.filter(|(_, y)| y.is_finite()) {
        x0 = x0.min(*x);
        x1 = x1.max(*x);
        y0 = y0.min(*y);
        y1 = y1.max(*y);
    }
    let dx = ((x1 - x0).max(1)) as f64;
    let dy = if y1 > y0 { y1 - y0 } else { 1.0 };
    let paths = lines
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let d = l
                .points
                .iter()
                .filter(|(_, y)| y.is_finite())
                .map(|(x, y)| {
                    format!(
                        "{:.1},{:.1}",
                        (*x - x0) as f64 / dx * CHART_W,
                        CHART_H - (y - y0) / dy * CHART_H
                    )
                })
                .collect::<Vec<_>>()
                .join(" ");
            let attempt = l.attempt.map(|a| a.to_string()).unwrap_or_default();
            view! { <polyline class=format!("line line-{}", i % 4) data-attempt=attempt points=d/> }
        })
        .collect_view();
    let last = lines
        .last()
        .and_then(|l| l.points.last())
        .map(|(s, v)| format!("step {s}: {}", shown(*v)))
        .unwrap_or_default();
    let metric = key.clone();
    view! {
        <figure class="chart" data-metric=metric>
            <figcaption><span class="mono">{key}</span>" "<span class="muted">{last}</span></figcaption>
            <svg viewBox=format!("0 -4 {CHART_W} {}", CHART_H + 8.0) role="img" preserveAspectRatio="none">
                {paths}
            </svg>
            <div class="axis muted">{format!("{} – {} over steps {x0}–{x1}", shown(y0), shown(y1))}</div>
        </figure>
    }
}

/// The submit form: a recipe (PyTorch, LLaMA-Factory, ms-swift, VERL) over a file of the
/// shared bucket, where it runs, its budget and its MLflow experiment; "Check" shows every verdict, then the plan, then the run.
#[component]
fn Submit(cluster: String) -> impl IntoView {
    let gate = Gate::default();
    let cluster = StoredValue::new(cluster);
    let job = RwSignal::new(String::new());
    let kind = RwSignal::new("pytorch".to_owned());
    let file = RwSignal::new(String::new());
    let args = RwSignal::new(String::new());
    let group = RwSignal::new(String::new());
    let nodes = RwSignal::new("1".to_owned());
    let processes = RwSignal::new(String::new());
    let image = RwSignal::new(String::new());
    let retries = RwSignal::new("50".to_owned());
    let command = RwSignal::new("sft".to_owned());
    let experiment = RwSignal::new(String::new());
    let checked = RwSignal::new(None::<Result<TrainingChecks, ApiError>>);
    let inputs = move || {
        let recipe = kind.get_untracked();
        let file_field = match recipe.as_str() {
            "pytorch" | "verl" => "recipe.script",
            _ => "recipe.config",
        };
        let mut inputs = vec![
            text("name", cluster.get_value()),
            text("job", job.get_untracked()),
            text("recipe.kind", recipe.clone()),
            text(file_field, file.get_untracked()),
            text("instance_group", group.get_untracked()),
            integer("nodes", nodes.get_untracked()),
            integer("processes_per_node", processes.get_untracked()),
            text("image", image.get_untracked()),
            text("mlflow_experiment", experiment.get_untracked()),
            integer("recovery.job_max_retry_count", retries.get_untracked()),
        ];
        if recipe == "ms_swift" {
            inputs.push(text("recipe.command", command.get_untracked()));
        }
        if matches!(recipe.as_str(), "pytorch" | "verl") {
            for (i, a) in args.get_untracked().split_whitespace().enumerate() {
                inputs.push(text(format!("recipe.args[{i}]"), a));
            }
        }
        inputs
    };
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        gate.start::<SubmitTrainingJob>(&inputs());
    };
    let run_checks = move |_| {
        let body = request(&inputs());
        leptos::task::spawn_local(async move {
            let result = match check::<CheckTrainingJob>(body) {
                Ok(r) => call(&r).await,
                Err(e) => Err(e),
            };
            checked.set(Some(result));
        });
    };
    let edit = move |s: RwSignal<String>| {
        let e = gate.edit(s);
        move |ev| {
            checked.set(None);
            e(ev)
        }
    };
    view! {
        <form class="panel submit-training" aria-label="Submit a training job" on:submit=submit>
            <h2>"Submit a training job"</h2>
            <label>"Job "<input type="text" name="job" placeholder="llama-sft-1"
                prop:value=move || job.get() on:input=edit(job)/></label>
            <label>"Recipe "
                <select name="recipe.kind" on:change=edit(kind) prop:value=move || kind.get()>
                    <option value="pytorch">"PyTorch script"</option>
                    <option value="llama_factory">"LLaMA-Factory config"</option>
                    <option value="ms_swift">"ms-swift config"</option>
                    <option value="verl">"VERL (Ray)"</option>
                </select>
            </label>
            <label class="swift-command" class:hidden=move || kind.get() != "ms_swift">"Command "
                <select name="recipe.command" on:change=edit(command) prop:value=move || command.get()>
                    <option value="sft">"swift sft"</option>
                    <option value="pt">"swift pt"</option>
                    <option value="rlhf">"swift rlhf"</option>
                    <option value="megatron_sft">"megatron sft"</option>
                    <option value="megatron_pt">"megatron pt"</option>
                    <option value="megatron_rlhf">"megatron rlhf"</option>
                </select>
            </label>
            <label>{move || match kind.get().as_str() {
                    "pytorch" => "Script ",
                    "verl" => "Script (empty: VERL's PPO trainer) ",
                    _ => "Config ",
                }}
                <input type="text" name="recipe.file" placeholder="/s3/scripts/train.py"
                    prop:value=move || file.get() on:input=edit(file)/></label>
            <label>"Arguments "<input type="text" name="recipe.args" placeholder="--epochs 3"
                disabled=move || !matches!(kind.get().as_str(), "pytorch" | "verl")
                prop:value=move || args.get() on:input=edit(args)/></label>
            <label>"Instance group "<input type="text" name="instance_group" placeholder="(the GPU group)"
                prop:value=move || group.get() on:input=edit(group)/></label>
            <label>"Nodes "<input type="text" inputmode="numeric" name="nodes"
                prop:value=move || nodes.get() on:input=edit(nodes)/></label>
            <label>"Processes per node "<input type="text" inputmode="numeric" name="processes_per_node" placeholder="(the GPUs)"
                prop:value=move || processes.get() on:input=edit(processes)/></label>
            <label>"Image "<input type="text" name="image" placeholder="(AWS PyTorch training image)"
                prop:value=move || image.get() on:input=edit(image)/></label>
            <label>"MLflow experiment "<input type="text" name="mlflow_experiment" placeholder="(the cluster's name)"
                prop:value=move || experiment.get() on:input=edit(experiment)/></label>
            <label>"Restarts in all "<input type="text" inputmode="numeric" name="recovery.job_max_retry_count"
                prop:value=move || retries.get() on:input=edit(retries)/></label>
            <div class="actions">
                <button type="button" class="check-training" on:click=run_checks>"Check"</button>
                <button class="primary" type="submit" disabled=move || gate.busy()>
                    {move || if gate.reviewing() { "Submit" } else { "Review plan" }}
                </button>
            </div>
            {move || checked.get().map(|c| match c {
                Ok(c) => Either::Left(view! { <Verdicts c/> }),
                Err(error) => Either::Right(view! { <ErrorPanel error/> }),
            })}
            {gate.view()}
        </form>
    }
    .into_any()
}

#[component]
fn Verdicts(c: TrainingChecks) -> impl IntoView {
    let items = c
        .checks
        .into_iter()
        .map(|v| {
            let state = if v.passed { "passed" } else { "failed" };
            let id = v.check.clone();
            view! {
                <li data-check=id data-passed=v.passed.to_string()>
                    <StateBadge state=state.to_owned()/>" "<strong>{v.check}</strong>" "{v.message}
                </li>
            }
        })
        .collect_view();
    view! {
        <div class=if c.ready { "verdicts ready" } else { "verdicts" }>
            <p>{if c.ready { "Every check passed." } else { "Not every check passed:" }}</p>
            <ul>{items}</ul>
        </div>
    }
}

/// Lines a log pane keeps on screen (older ones scroll away; Download saves these).
const SHOWN_LINES: usize = 2000;

/// One pod's log, live: the pod to follow, pause (lines keep coming in but the view
/// holds still), a search that shows matching lines only, and a download of the lines
/// shown. A viewer cut off for falling behind reconnects after the last line it has.
#[component]
fn LogPane(cluster: String, job: String, pods: Vec<String>) -> impl IntoView {
    let pod = RwSignal::new(pods.first().cloned().unwrap_or_default());
    let lines = RwSignal::new(std::collections::VecDeque::<(u64, String)>::new());
    let held = RwSignal::new(Vec::<(u64, String)>::new());
    let paused = RwSignal::new(false);
    let search = RwSignal::new(String::new());
    let status = RwSignal::new(String::from("connecting"));
    let add = move |batch: Vec<(u64, String)>| {
        if paused.get_untracked() {
            held.update(|h| h.extend(batch));
            return;
        }
        lines.update(|l| {
            l.extend(held.try_update(std::mem::take).unwrap_or_default());
            l.extend(batch);
            while l.len() > SHOWN_LINES {
                l.pop_front();
            }
        });
    };
    #[cfg(feature = "hydrate")]
    {
        let generation = StoredValue::new(0u64);
        let (cluster, job) = (cluster.clone(), job.clone());
        Effect::new(move || {
            let chosen = pod.get();
            if chosen.is_empty() {
                return;
            }
            generation.update_value(|g| *g += 1);
            let mine = generation.get_value();
            lines.set(Default::default());
            held.set(Vec::new());
            let (cluster, job) = (cluster.clone(), job.clone());
            leptos::task::spawn_local(async move {
                browser::follow(&cluster, &job, &chosen, mine, generation, status, add).await;
            });
        });
    }
    #[cfg(not(feature = "hydrate"))]
    let _ = (&cluster, &job, add);
    let choices = pods
        .into_iter()
        .map(|p| view! { <option value=p.clone()>{p.clone()}</option> })
        .collect_view();
    let shown = move || {
        let needle = search.get();
        lines.with(|l| {
            l.iter()
                .filter(|(_, t)| needle.is_empty() || t.contains(&needle))
                .map(|(seq, t)| format!("{seq:>7}  {t}"))
                .collect::<Vec<_>>()
                .join("\n")
        })
    };
    let download = move || {
        let text = lines.with(|l| {
            l.iter()
                .map(|(_, t)| t.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        });
        format!("data:text/plain;charset=utf-8,{}", percent(&text))
    };
    view! {
        <div class="log-pane" aria-label="Pod log">
            <h3>"Log"</h3>
            <div class="log-controls">
                <label>"Pod "<select name="log-pod" on:change=move |ev| pod.set(event_target_value(&ev)) prop:value=move || pod.get()>{choices}</select></label>
                <button type="button" class="log-pause" on:click=move |_| {
                    let resume = paused.get_untracked();
                    paused.set(!resume);
                    if resume {
                        add(Vec::new());
                    }
                }>{move || if paused.get() { "Follow" } else { "Pause" }}</button>
                <label>"Search "<input type="search" name="log-search" prop:value=move || search.get()
                    on:input=move |ev| search.set(event_target_value(&ev))/></label>
                <a class="log-download" download=format!("{job}.log") href=download>"Download"</a>
                <span class="log-status muted">{move || status.get()}</span>
            </div>
            // Reversed, so the view stays at the newest line as lines come in.
            <div class="log-scroll">
                <pre class="log" data-lines=move || lines.with(|l| l.len())>{shown}</pre>
            </div>
        </div>
    }
}

/// `text` as a URL's data: everything but unreserved characters percent-encoded.
fn percent(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3 / 2);
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(feature = "hydrate")]
mod browser {
    use futures::StreamExt;
    use gloo_net::websocket::{Message, futures::WebSocket};
    use leptos::prelude::*;

    fn url(cluster: &str, job: &str, pod: &str, after: Option<u64>) -> Option<String> {
        let location = web_sys::window()?.location();
        let scheme = if location.protocol().ok()? == "https:" {
            "wss"
        } else {
            "ws"
        };
        let from = after.map_or_else(|| "tail_lines=200".to_owned(), |a| format!("after={a}"));
        Some(format!(
            "{scheme}://{}/api/v1/clusters/{cluster}/training-jobs/{job}/logs/stream?pod={pod}&{from}",
            location.host().ok()?
        ))
    }

    /// Follows `pod`'s log into the pane until the container ends or another pod is
    /// chosen (`generation` moves on); reconnects after the last line seen when cut off.
    pub async fn follow(
        cluster: &str,
        job: &str,
        pod: &str,
        mine: u64,
        generation: StoredValue<u64>,
        status: RwSignal<String>,
        add: impl Fn(Vec<(u64, String)>) + Copy + 'static,
    ) {
        let mut last: Option<u64> = None;
        loop {
            let Some(url) = url(cluster, job, pod, last) else {
                return;
            };
            let Ok(socket) = WebSocket::open(&url) else {
                status.set("cannot connect".into());
                return;
            };
            status.set("following".into());
            let (_write, mut read) = socket.split();
            let mut ended = false;
            while let Some(Ok(message)) = read.next().await {
                if generation.get_value() != mine {
                    return;
                }
                let Message::Text(text) = message else {
                    continue;
                };
                let Ok(frame) = serde_json::from_str::<serde_json::Value>(&text) else {
                    continue;
                };
                match frame["type"].as_str() {
                    Some("lines") => {
                        let batch: Vec<(u64, String)> = frame["lines"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|l| {
                                Some((l["seq"].as_u64()?, l["text"].as_str()?.to_owned()))
                            })
                            .collect();
                        last = batch.last().map(|(s, _)| *s).or(last);
                        add(batch);
                    }
                    Some("missed") => status.set(format!(
                        "fell {} lines behind: catching up",
                        frame["lines"].as_u64().unwrap_or(0)
                    )),
                    Some("end") => {
                        status.set(frame["reason"].as_str().unwrap_or("ended").to_owned());
                        ended = true;
                    }
                    _ => {}
                }
            }
            if ended || generation.get_value() != mine {
                return;
            }
        }
    }
}
