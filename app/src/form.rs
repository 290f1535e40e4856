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

/// The request object of a form of text inputs: each input's text under its field name.
/// An empty input is left out: an optional field then takes its default, a required one
/// is reported missing, as the server would.
pub fn request_json(fields: &[(&str, String)]) -> Value {
    let inputs: Vec<(&str, Input)> = fields
        .iter()
        .map(|(name, value)| (*name, Input::Text(value.clone())))
        .collect();
    request(&inputs)
}

/// One input's value, as the request's JSON wants it.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// Text; left out when empty.
    Text(String),
    /// A whole number typed as text; left out when empty. Text that is not a number is
    /// sent as it is, so the field's own rule reports it.
    Integer(String),
    /// A checkbox.
    Flag(bool),
}

/// The request object of a form. A dotted name (`network.vpc_cidr`) is a field of a
/// nested object, so an error's path and the input's name are the same string.
pub fn request(fields: &[(&str, Input)]) -> Value {
    let mut object = Value::Object(Map::new());
    for (name, input) in fields {
        let value = match input {
            Input::Text(t) | Input::Integer(t) if t.trim().is_empty() => continue,
            Input::Text(t) => Value::String(t.trim().to_owned()),
            Input::Integer(t) => t
                .trim()
                .parse::<i64>()
                .map_or_else(|_| Value::String(t.trim().to_owned()), Value::from),
            Input::Flag(b) => Value::Bool(*b),
        };
        let mut at = &mut object;
        let mut parts = name.split('.').peekable();
        while let Some(part) = parts.next() {
            let Value::Object(map) = at else { break };
            if parts.peek().is_none() {
                map.insert(part.to_owned(), value);
                break;
            }
            at = map
                .entry(part.to_owned())
                .or_insert_with(|| Value::Object(Map::new()));
        }
    }
    object
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

/// The element id of the input for a request field (`network.vpc_cidr` →
/// `network-vpc_cidr`): dots would need escaping in every CSS selector.
pub fn input_id(name: &str) -> String {
    name.replace('.', "-")
}

/// A labelled text input bound to `value`, with its errors below it, tied together for
/// screen readers (`aria-invalid`, `aria-describedby`).
#[component]
pub fn TextField(
    form: FormState,
    /// The request field's path; the input's id is [`input_id`] of it.
    name: &'static str,
    label: &'static str,
    value: RwSignal<String>,
    #[prop(optional)] hint: Option<&'static str>,
    #[prop(optional)] placeholder: Option<&'static str>,
    #[prop(optional)] required: bool,
    /// `number` for a count (the browser offers digits); text otherwise.
    #[prop(optional)]
    numeric: bool,
) -> impl IntoView {
    let errors = move || form.errors_for(name);
    let id = input_id(name);
    let described = format!("{id}-hint {id}-error");
    view! {
        <div class="field" class:invalid=move || !errors().is_empty() data-field=name>
            <label for=id.clone()>{label} {(!required).then_some(view! { <span class="optional">" (optional)"</span> })}</label>
            <input
                id=id.clone()
                name=name
                type=if numeric { "number" } else { "text" }
                inputmode=numeric.then_some("numeric")
                min=numeric.then_some("0")
                autocomplete="off"
                spellcheck="false"
                placeholder=placeholder
                aria-invalid=move || if errors().is_empty() { "false" } else { "true" }
                aria-describedby=described
                prop:value=move || value.get()
                on:input=move |ev| value.set(event_target_value(&ev))
            />
            {hint.map(|h| view! { <p class="hint" id=format!("{id}-hint")>{h}</p> })}
            <FieldErrors id=id.clone() errors=Signal::derive(errors)/>
        </div>
    }
}

/// A labelled checkbox bound to `checked`, with its errors below it.
#[component]
pub fn CheckField(
    form: FormState,
    name: &'static str,
    label: &'static str,
    checked: RwSignal<bool>,
    #[prop(optional)] hint: Option<&'static str>,
) -> impl IntoView {
    let errors = move || form.errors_for(name);
    let id = input_id(name);
    let described = format!("{id}-hint {id}-error");
    view! {
        <div class="field check" class:invalid=move || !errors().is_empty() data-field=name>
            <input
                id=id.clone()
                name=name
                type="checkbox"
                aria-invalid=move || if errors().is_empty() { "false" } else { "true" }
                aria-describedby=described
                prop:checked=move || checked.get()
                on:change=move |ev| checked.set(event_target_checked(&ev))
            />
            <label for=id.clone()>{label}</label>
            {hint.map(|h| view! { <p class="hint" id=format!("{id}-hint")>{h}</p> })}
            <FieldErrors id=id.clone() errors=Signal::derive(errors)/>
        </div>
    }
}

/// A group of radio buttons (a fieldset with its legend) bound to `value`; `options` are
/// (value, label, hint) triples. Arrow keys move between them, as browsers do for radios.
#[component]
pub fn ChoiceField(
    form: FormState,
    name: &'static str,
    label: &'static str,
    value: RwSignal<String>,
    options: &'static [(&'static str, &'static str, &'static str)],
) -> impl IntoView {
    let errors = move || form.errors_for(name);
    let id = input_id(name);
    view! {
        <fieldset class="field choice" class:invalid=move || !errors().is_empty() data-field=name
            aria-describedby=format!("{id}-error")>
            <legend>{label}</legend>
            {options
                .iter()
                .map(|(v, l, h)| {
                    let option_id = format!("{id}-{v}");
                    view! {
                        <div class="choice-option">
                            <input
                                type="radio"
                                id=option_id.clone()
                                name=name
                                value=*v
                                aria-describedby=format!("{option_id}-hint")
                                prop:checked=move || value.with(|cur| cur == v)
                                on:change=move |_| value.set((*v).to_owned())
                            />
                            <label for=option_id.clone()>{*l}</label>
                            <p class="hint" id=format!("{option_id}-hint")>{*h}</p>
                        </div>
                    }
                })
                .collect_view()}
            <FieldErrors id=id.clone() errors=Signal::derive(errors)/>
        </fieldset>
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
    let id = input_id(name);
    let described = format!("{id}-hint {id}-error");
    view! {
        <div class="field" class:invalid=move || !errors().is_empty() data-field=name>
            <label for=id.clone()>{label}</label>
            <select
                id=id.clone()
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
            {hint.map(|h| view! { <p class="hint" id=format!("{id}-hint")>{h}</p> })}
            <FieldErrors id=id.clone() errors=Signal::derive(errors)/>
        </div>
    }
}

#[component]
fn FieldErrors(id: String, errors: Signal<Vec<String>>) -> impl IntoView {
    view! {
        <div class="field-error" id=format!("{id}-error") role="alert" aria-live="polite">
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
    fn inputs_become_typed_and_nested_json() {
        let v = request(&[
            ("name", Input::Text("ml-1".into())),
            ("instance_count", Input::Integer(" 4 ".into())),
            ("efa_only", Input::Flag(true)),
            ("network.vpc_cidr", Input::Text("10.3.0.0/16".into())),
            ("network.vpc_id", Input::Text(String::new())),
            ("capacity.type", Input::Text("spot".into())),
            ("kubernetes_version", Input::Integer(String::new())),
        ]);
        assert_eq!(
            v,
            json!({
                "name": "ml-1", "instance_count": 4, "efa_only": true,
                "network": { "vpc_cidr": "10.3.0.0/16" }, "capacity": { "type": "spot" },
            })
        );
        assert_eq!(
            request(&[("instance_count", Input::Integer("two".into()))]),
            json!({ "instance_count": "two" })
        );
        assert_eq!(input_id("network.vpc_cidr"), "network-vpc_cidr");
    }

    #[test]
    fn the_create_form_checks_every_field_it_has() {
        use crate::api::clusters::CreateCluster;
        let base = || {
            vec![
                ("name", Input::Text("ml-1".into())),
                ("availability_zone", Input::Text("us-east-1a".into())),
                ("instance_type", Input::Text("ml.g5.8xlarge".into())),
                ("instance_count", Input::Integer("2".into())),
                ("capacity.type", Input::Text("on_demand".into())),
            ]
        };
        let ok = check::<CreateCluster>(request(&base())).unwrap();
        assert_eq!(ok.instance_count.get(), 2);
        // Each bad value is named by the path its input carries.
        for (field, input) in [
            ("instance_count", Input::Integer("0".into())),
            ("instance_count", Input::Integer("two".into())),
            ("network.vpc_cidr", Input::Text("10.0.0.0/8".into())),
            ("network.vpc_cidr", Input::Text("10.0.0.0/20".into())),
            ("network.vpc_id", Input::Text("vpc-nope".into())),
            ("storage.s3_bucket", Input::Text("Bad_Bucket".into())),
            ("kubernetes_version", Input::Text("2.0".into())),
            ("efa_only", Input::Flag(true)),
        ] {
            let mut inputs = base();
            inputs.retain(|(n, _)| *n != field);
            inputs.push((field, input));
            let err = check::<CreateCluster>(request(&inputs)).unwrap_err();
            assert_eq!(err.errors_for(field).len(), 1, "{field}: {err:?}");
        }
        let mut inputs = base();
        inputs.push(("capacity.type", Input::Text("training_plan".into())));
        inputs.push(("capacity.training_plan_arn", Input::Text("arn:nope".into())));
        let err = check::<CreateCluster>(request(&inputs)).unwrap_err();
        let ApiError::Validation { errors } = &err else {
            panic!("{err:?}")
        };
        assert!(errors[0].field.starts_with("capacity"), "{err:?}");
        let err = check::<CreateCluster>(json!({})).unwrap_err();
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
