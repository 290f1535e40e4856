//! Forms over commands: a form's fields are the command's request fields, checked in the
//! browser by the very decoding and `validate()` the server runs, and an error, whether
//! found here or returned by the server, is shown beside the field its path names. No
//! page writes its own rules: a form only says which inputs map to which request fields.

use leptos::prelude::*;
use serde_json::{Map, Value};

use crate::api::{ApiError, Command, FieldError};

/// Decodes form input into the command's request exactly as the server's dispatch does
/// (field paths included), then runs the command's cross-field rules.
pub fn check<C: Command>(input: Value) -> Result<C, ApiError> {
    let request: C = crate::api::decode(input).map_err(|e| match e {
        // Beside an empty input, "required" says it better than serde's wording.
        ApiError::Validation { errors } => ApiError::Validation {
            errors: errors
                .into_iter()
                .map(|e| {
                    if e.message.starts_with("missing field `") {
                        FieldError::new(e.field, "required")
                    } else {
                        e
                    }
                })
                .collect(),
        },
        other => other,
    })?;
    request.validate()?;
    Ok(request)
}

/// The request object of a form: each input's text under its field name. An empty input
/// is left out: an optional field then takes its default, a required one is reported
/// missing, as the server would.
pub fn request_json(fields: &[(&str, String)]) -> Value {
    let mut object = Map::new();
    for (name, value) in fields {
        let value = value.trim();
        if !value.is_empty() {
            object.insert((*name).to_owned(), Value::String(value.to_owned()));
        }
    }
    Value::Object(object)
}

/// What a form shows besides its inputs: field errors, a general error, whether it is
/// submitting. `fields` lists the paths that have an input, so an error naming any other
/// path is shown at the top rather than lost.
#[derive(Clone, Copy)]
pub struct FormState {
    pub fields: &'static [&'static str],
    pub errors: RwSignal<Vec<FieldError>>,
    pub general: RwSignal<Option<String>>,
    pub busy: RwSignal<bool>,
}

impl FormState {
    pub fn new(fields: &'static [&'static str]) -> Self {
        Self {
            fields,
            errors: RwSignal::new(Vec::new()),
            general: RwSignal::new(None),
            busy: RwSignal::new(false),
        }
    }

    pub fn clear(&self) {
        self.errors.set(Vec::new());
        self.general.set(None);
    }

    /// Shows an error where it belongs: validation errors beside their fields (or at the
    /// top when no input has that path), anything else at the top.
    pub fn show(&self, error: ApiError) {
        let (beside, general) = split_errors(self.fields, error);
        self.errors.set(beside);
        self.general.set(general);
    }

    pub fn errors_for(&self, field: &str) -> Vec<String> {
        self.errors.with(|all| {
            all.iter()
                .filter(|e| e.field == field)
                .map(|e| e.message.clone())
                .collect()
        })
    }
}

/// Splits an error into the field errors shown beside inputs and one line for the top.
pub fn split_errors(fields: &[&str], error: ApiError) -> (Vec<FieldError>, Option<String>) {
    match error {
        ApiError::Validation { errors } => {
            let (beside, elsewhere): (Vec<_>, Vec<_>) = errors
                .into_iter()
                .partition(|e| fields.contains(&e.field.as_str()));
            let general = (!elsewhere.is_empty()).then(|| {
                elsewhere
                    .iter()
                    .map(|e| {
                        if e.field.is_empty() {
                            e.message.clone()
                        } else {
                            format!("{}: {}", e.field, e.message)
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            });
            (beside, general)
        }
        other => (Vec::new(), Some(other.to_string())),
    }
}

/// A labelled text input bound to `value`, with its errors below it, tied together for
/// screen readers (`aria-invalid`, `aria-describedby`).
#[component]
pub fn TextField(
    form: FormState,
    /// The request field's path, also the input's id.
    name: &'static str,
    label: &'static str,
    value: RwSignal<String>,
    #[prop(optional)] hint: Option<&'static str>,
    #[prop(optional)] placeholder: Option<&'static str>,
    #[prop(optional)] required: bool,
) -> impl IntoView {
    let errors = move || form.errors_for(name);
    let described = format!("{name}-hint {name}-error");
    view! {
        <div class="field" class:invalid=move || !errors().is_empty() data-field=name>
            <label for=name>{label} {(!required).then_some(view! { <span class="optional">" (optional)"</span> })}</label>
            <input
                id=name
                name=name
                type="text"
                autocomplete="off"
                spellcheck="false"
                placeholder=placeholder
                aria-invalid=move || if errors().is_empty() { "false" } else { "true" }
                aria-describedby=described
                prop:value=move || value.get()
                on:input=move |ev| value.set(event_target_value(&ev))
            />
            {hint.map(|h| view! { <p class="hint" id=format!("{name}-hint")>{h}</p> })}
            <FieldErrors name errors=Signal::derive(errors)/>
        </div>
    }
}

/// A labelled select bound to `value`; `options` are (value, label) pairs, usually filled
/// by an inspection command.
#[component]
pub fn SelectField(
    form: FormState,
    name: &'static str,
    label: &'static str,
    value: RwSignal<String>,
    options: Signal<Vec<(String, String)>>,
    #[prop(optional)] hint: Option<&'static str>,
    /// The label of the empty choice, when the field is optional.
    #[prop(optional)]
    empty: Option<&'static str>,
) -> impl IntoView {
    let errors = move || form.errors_for(name);
    let described = format!("{name}-hint {name}-error");
    view! {
        <div class="field" class:invalid=move || !errors().is_empty() data-field=name>
            <label for=name>{label}</label>
            <select
                id=name
                name=name
                aria-invalid=move || if errors().is_empty() { "false" } else { "true" }
                aria-describedby=described
                on:change=move |ev| value.set(event_target_value(&ev))
                prop:value=move || value.get()
            >
                {empty.map(|e| view! { <option value="">{e}</option> })}
                <For
                    each=move || options.get()
                    key=|(v, _)| v.clone()
                    children=move |(v, l)| {
                        let selected = {
                            let v = v.clone();
                            move || value.with(|cur| *cur == v)
                        };
                        view! { <option value=v selected=selected>{l}</option> }
                    }
                />
            </select>
            {hint.map(|h| view! { <p class="hint" id=format!("{name}-hint")>{h}</p> })}
            <FieldErrors name errors=Signal::derive(errors)/>
        </div>
    }
}

#[component]
fn FieldErrors(name: &'static str, errors: Signal<Vec<String>>) -> impl IntoView {
    view! {
        <div class="field-error" id=format!("{name}-error") role="alert" aria-live="polite">
            <For each=move || errors.get() key=|m| m.clone() let:m>
                <p>{m}</p>
            </For>
        </div>
    }
}

/// The form-level error line, shown above the submit button.
#[component]
pub fn FormAlert(form: FormState) -> impl IntoView {
    view! {
        <Show when=move || form.general.with(Option::is_some)>
            <div class="form-alert" role="alert">
                {move || form.general.get().unwrap_or_default()}
            </div>
        </Show>
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::clusters::GetCluster;
    use crate::api::tokens::CreateToken;
    use serde_json::json;

    #[test]
    fn a_bad_value_is_named_by_its_field() {
        let err = check::<GetCluster>(json!({ "name": "bad_name" })).unwrap_err();
        let msgs = err.errors_for("name");
        assert_eq!(msgs.len(), 1, "{err:?}");
        assert!(msgs[0].contains("letters, digits and hyphens"), "{msgs:?}");
        assert!(check::<GetCluster>(json!({ "name": "ml-1" })).is_ok());
    }

    #[test]
    fn a_missing_field_is_required() {
        let err = check::<CreateToken>(json!({ "role": "viewer" })).unwrap_err();
        assert_eq!(err.errors_for("name"), vec!["required"]);
        let err = check::<CreateToken>(json!({ "name": "ci", "role": "root" })).unwrap_err();
        assert_eq!(err.errors_for("role").len(), 1, "{err:?}");
    }

    #[test]
    fn the_import_form_checks_every_field_it_has() {
        use crate::api::clusters::ImportCluster;
        let input = request_json(&[
            ("name", "e2e-eks".into()),
            ("region", "us-east-1".into()),
            ("hyperpod_cluster", String::new()),
        ]);
        let ok = check::<ImportCluster>(input).unwrap();
        assert_eq!(ok.name.as_str(), "e2e-eks");
        assert!(ok.hyperpod_cluster.is_none());
        for (field, value) in [
            ("name", "not a name!"),
            ("region", "Mars"),
            ("hyperpod_cluster", "hp_1"),
        ] {
            let mut input = json!({ "name": "e2e-eks" });
            input[field] = json!(value);
            let err = check::<ImportCluster>(input).unwrap_err();
            assert_eq!(err.errors_for(field).len(), 1, "{field}: {err:?}");
            let (beside, general) = split_errors(&["name", "region", "hyperpod_cluster"], err);
            assert_eq!(beside.len(), 1);
            assert!(general.is_none());
        }
        let err = check::<ImportCluster>(json!({})).unwrap_err();
        assert_eq!(err.errors_for("name"), vec!["required"]);
    }

    #[test]
    fn empty_optional_inputs_are_left_out() {
        let v = request_json(&[("name", " ml-1 ".into()), ("region", String::new())]);
        assert_eq!(v, json!({ "name": "ml-1" }));
    }

    #[test]
    fn errors_go_beside_their_field_or_to_the_top() {
        let error = ApiError::Validation {
            errors: vec![
                FieldError::new("name", "taken"),
                FieldError::new("network.vpc_cidr", "overlaps"),
                FieldError::new("", "malformed"),
            ],
        };
        let (beside, general) = split_errors(&["name"], error);
        assert_eq!(beside, vec![FieldError::new("name", "taken")]);
        assert_eq!(
            general.as_deref(),
            Some("network.vpc_cidr: overlaps; malformed")
        );
        let (beside, general) = split_errors(
            &["name"],
            ApiError::Forbidden {
                message: "import_cluster needs the operator role".into(),
            },
        );
        assert!(beside.is_empty());
        assert_eq!(
            general.as_deref(),
            Some("import_cluster needs the operator role")
        );
    }
}
