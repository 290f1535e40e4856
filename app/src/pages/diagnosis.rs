//! A diagnosis as the console shows it: what was found, most severe first, and the
//! commands it suggests, written as the command and its arguments with what each would
//! change. Nothing here runs them: the user takes the step from the page that offers it.

use leptos::prelude::*;

use crate::api::Effect;
use crate::api::diagnose::Diagnosis;

#[component]
pub fn DiagnosisView(found: Diagnosis) -> impl IntoView {
    let suggested = !found.suggestions.is_empty();
    view! {
        <div class="diagnosis" data-subject=found.subject.clone()>
            <ul class="findings">
                {found.findings.into_iter().map(|f| view! {
                    <li class="finding" data-severity=severity(f.severity)>
                        {f.summary}
                        {f.evidence.map(|e| view! { <span class="muted evidence">" — " {e}</span> })}
                    </li>
                }).collect_view()}
            </ul>
            {suggested.then(|| view! { <h3>"Suggested next"</h3> })}
            <ol class="suggestions">
                {found.suggestions.into_iter().map(|s| {
                    let args = s.arguments.iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(", ");
                    view! {
                        <li class="suggestion" data-command=s.command.clone()>
                            <code>{format!("{}({args})", s.command)}</code>
                            " "
                            <span class="muted">{format!("{}: {}", effect_word(s.effect), s.why)}</span>
                        </li>
                    }
                }).collect_view()}
            </ol>
        </div>
    }
}

fn severity(s: crate::api::diagnose::Severity) -> &'static str {
    use crate::api::diagnose::Severity;
    match s {
        Severity::Info => "info",
        Severity::Warning => "warning",
        Severity::Error => "error",
    }
}

fn effect_word(effect: Effect) -> &'static str {
    match effect {
        Effect::ReadOnly => "reads only",
        Effect::Mutating => "changes state",
        Effect::Destructive => "deletes or replaces",
    }
}
