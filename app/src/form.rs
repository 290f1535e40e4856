//! Forms over commands. A form declares each input once, as a [`Field`] (the request path
//! it fills, its label, kind and hint), and everything else follows from that
//! declaration: the inputs, the request JSON (nested objects and arrays by path), and
//! which error goes beside which input. The checks are the command's own decoding and
//! `validate()`, run in the browser exactly as the server runs them, so no page writes a
//! rule of its own; what the person sees is what is sent.

use leptos::either::EitherOf4;
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

/// One input's value, as the request's JSON wants it.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// Text; left out when empty.
    Text(String),
    /// A whole number typed as text; left out when empty. Text that is not a number is
    /// sent as it is, so the field's own rule reports it.
    Integer(String),
    /// A number that may have a fraction, typed as text; otherwise as `Integer`.
    Number(String),
    /// A checkbox.
    Flag(bool),
}

impl Input {
    fn json(&self) -> Option<Value> {
        Some(match self {
            Input::Text(t) | Input::Integer(t) | Input::Number(t) if t.trim().is_empty() => {
                return None;
            }
            Input::Text(t) => Value::String(t.trim().to_owned()),
            Input::Integer(t) => t
                .trim()
                .parse::<i64>()
                .map_or_else(|_| Value::String(t.trim().to_owned()), Value::from),
            // serde_json's own number parser: the console already carries it, where
            // core's float parser would add kilobytes to every page.
            Input::Number(t) => t
                .trim()
                .parse::<serde_json::Number>()
                .map_or_else(|_| Value::String(t.trim().to_owned()), Value::Number),
            Input::Flag(b) => Value::Bool(*b),
        })
    }
}

/// One step of a request path: `instance_groups[1].capacity.type` is the key
/// `instance_groups`, the index 1, then the keys `capacity` and `type`; the same notation
/// the server's errors use, so an input's path and its errors' path are one string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

fn steps(path: &str) -> Option<Vec<Step<'_>>> {
    let mut steps = Vec::new();
    for part in path.split('.') {
        let (key, mut rest) = part.split_once('[').map_or((part, ""), |(k, r)| (k, r));
        if key.is_empty() {
            return None;
        }
        steps.push(Step::Key(key));
        while !rest.is_empty() {
            let (index, after) = rest.split_once(']')?;
            steps.push(Step::Index(index.parse().ok()?));
            rest = after.strip_prefix('[').unwrap_or(after);
            if !after.is_empty() && !after.starts_with('[') {
                return None;
            }
        }
    }
    Some(steps)
}

/// Puts `value` at `steps` inside `at`, making the objects and arrays on the way. An
/// array is padded with empty objects up to the index: a list's items are objects, and an
/// empty one is reported by the item's own rules (`instance_groups[0].name: required`).
fn put(at: &mut Value, steps: &[Step<'_>], value: Value) {
    let Some((step, rest)) = steps.split_first() else {
        *at = value;
        return;
    };
    let empty = || match rest.first() {
        Some(Step::Index(_)) => Value::Array(Vec::new()),
        _ => Value::Object(Map::new()),
    };
    match (step, at) {
        (Step::Key(key), Value::Object(map)) => {
            let next = map.entry((*key).to_owned()).or_insert_with(empty);
            put(next, rest, value);
        }
        (Step::Index(i), Value::Array(items)) => {
            while items.len() <= *i {
                items.push(Value::Object(Map::new()));
            }
            if rest.is_empty() {
                items[*i] = value;
            } else {
                put(&mut items[*i], rest, value);
            }
        }
        // A path that contradicts another input's (an object where a list is): the
        // first input's shape stands and decoding reports what is missing.
        _ => {}
    }
}

/// The request object of a form: each input's value at its path. An empty input is left
/// out: an optional field then takes its default, a required one is reported missing, as
/// the server would.
pub fn request<P: AsRef<str>>(inputs: &[(P, Input)]) -> Value {
    let mut object = Value::Object(Map::new());
    for (path, input) in inputs {
        if let (Some(steps), Some(value)) = (steps(path.as_ref()), input.json()) {
            put(&mut object, &steps, value);
        }
    }
    object
}

/// Whether `path` lies inside `outer` (`instance_groups[0].capacity.type` inside
/// `instance_groups[0].capacity` and `instance_groups`).
fn within(path: &str, outer: &str) -> bool {
    path.strip_prefix(outer)
        .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
}

/// Splits an error into the field errors shown beside inputs and one line for the top.
/// `places` are the paths that show errors, in page order. An error naming a place is
/// shown there; one naming an object or list without a place of its own
/// (`instance_groups[0].capacity`) beside the first place inside it; anything else at
/// the top, so no error is lost.
pub fn split_errors<P: AsRef<str>>(
    places: &[P],
    error: ApiError,
) -> (Vec<FieldError>, Option<String>) {
    match error {
        ApiError::Validation { errors } => {
            let mut beside = Vec::new();
            let mut elsewhere = Vec::new();
            for e in errors {
                let exact = places.iter().find(|p| p.as_ref() == e.field);
                let inside = || places.iter().find(|p| within(p.as_ref(), &e.field));
                match exact.or_else(|| inside().filter(|_| !e.field.is_empty())) {
                    Some(place) => beside.push(FieldError::new(place.as_ref(), e.message)),
                    None => elsewhere.push(e),
                }
            }
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

/// The element id of the input for a request path (`instance_groups[1].capacity.type` →
/// `instance_groups-1-capacity-type`): dots and brackets would need escaping in every CSS
/// selector.
pub fn input_id(path: &str) -> String {
    path.replace(['.', '['], "-").replace(']', "")
}

/// One option of a [`Kind::Choice`]: its value, label and a line explaining it.
#[derive(Clone, Copy, Debug)]
pub struct Choice {
    pub value: &'static str,
    pub label: &'static str,
    pub hint: &'static str,
}

/// How a field is entered, and so what JSON its text becomes.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// A string.
    Text,
    /// A whole number.
    Integer,
    /// A checkbox: a boolean.
    Flag,
    /// Radio buttons, one per option: a string.
    Choice(&'static [Choice]),
    /// A select whose options the page supplies (usually from an inspection command).
    Select,
}

/// One input of a form, declared once: the page renders it with [`FieldInput`], and its
/// value and errors are found by its path.
#[derive(Clone, Copy, Debug)]
pub struct Field {
    /// Its path in the request, relative to its record: `name`, `network.vpc_cidr`, or
    /// `capacity.type` inside an item of a list.
    pub path: &'static str,
    pub label: &'static str,
    pub kind: Kind,
    pub hint: Option<&'static str>,
    pub placeholder: Option<&'static str>,
    pub required: bool,
    /// The value a new form (or a new item of a list) starts with.
    pub default: &'static str,
    /// Shown, and so sent, only while another field of the same record has this value.
    pub when: Option<(&'static str, &'static str)>,
}

impl Field {
    const fn new(path: &'static str, label: &'static str, kind: Kind) -> Self {
        Self {
            path,
            label,
            kind,
            hint: None,
            placeholder: None,
            required: false,
            default: "",
            when: None,
        }
    }

    pub const fn text(path: &'static str, label: &'static str) -> Self {
        Self::new(path, label, Kind::Text)
    }

    pub const fn integer(path: &'static str, label: &'static str) -> Self {
        Self::new(path, label, Kind::Integer)
    }

    pub const fn flag(path: &'static str, label: &'static str) -> Self {
        Self::new(path, label, Kind::Flag).default("false")
    }

    pub const fn choice(
        path: &'static str,
        label: &'static str,
        options: &'static [Choice],
    ) -> Self {
        Self::new(path, label, Kind::Choice(options))
    }

    pub const fn select(path: &'static str, label: &'static str) -> Self {
        Self::new(path, label, Kind::Select)
    }

    pub const fn required(mut self) -> Self {
        self.required = true;
        self
    }

    pub const fn hint(mut self, hint: &'static str) -> Self {
        self.hint = Some(hint);
        self
    }

    pub const fn placeholder(mut self, placeholder: &'static str) -> Self {
        self.placeholder = Some(placeholder);
        self
    }

    pub const fn default(mut self, value: &'static str) -> Self {
        self.default = value;
        self
    }

    pub const fn when(mut self, path: &'static str, value: &'static str) -> Self {
        self.when = Some((path, value));
        self
    }

    /// The request value of this field's text.
    pub fn input(&self, text: String) -> Input {
        match self.kind {
            Kind::Integer => Input::Integer(text),
            Kind::Flag => Input::Flag(text == "true"),
            Kind::Text | Kind::Choice(_) | Kind::Select => Input::Text(text),
        }
    }
}

/// The values of one set of declared fields: the form's own, or one item of a list. Each
/// value is kept as the text the input holds (`"true"`/`"false"` for a checkbox); its
/// field's kind says what JSON it becomes.
#[derive(Clone, Copy)]
pub struct Record {
    /// Where the record sits in the request: empty for the form itself,
    /// `instance_groups[1]` for an item, which changes when an item before it is removed.
    at: Signal<String>,
    values: StoredValue<Vec<(&'static str, RwSignal<String>)>>,
}

impl Record {
    fn new(fields: &[Field], at: Signal<String>) -> Self {
        let values = fields
            .iter()
            .map(|f| (f.path, RwSignal::new(f.default.to_owned())))
            .collect();
        Self {
            at,
            values: StoredValue::new(values),
        }
    }

    /// The value of the declared field at `path`.
    ///
    /// # Panics
    /// When no field of the record has that path: a page naming a field it did not
    /// declare is a programming error, found by its first render.
    pub fn value(&self, path: &str) -> RwSignal<String> {
        self.values
            .with_value(|v| v.iter().find(|(p, _)| *p == path).map(|(_, s)| *s))
            .unwrap_or_else(|| panic!("no field {path} is declared"))
    }

    /// A field's full path in the request (`instance_groups[1].name`).
    pub fn path(&self, field: &str) -> String {
        self.at.with(|at| {
            if at.is_empty() {
                field.to_owned()
            } else {
                format!("{at}.{field}")
            }
        })
    }
}

/// Something on the page that shows errors: an input (with its value), or a list's own
/// line for errors about the list as a whole. Only the form's own state is kept here, so
/// a place outlives nothing it points to.
#[derive(Clone, Copy)]
struct Place {
    key: u64,
    /// The record the path is relative to; none for a list's own line.
    record: Option<Record>,
    path: &'static str,
    value: Option<(Field, RwSignal<String>)>,
}

impl Place {
    fn path(&self) -> String {
        self.record
            .map_or_else(|| self.path.to_owned(), |r| r.path(self.path))
    }
}

/// A form: its state (errors beside inputs, the line at the top, whether it is
/// submitting) and what is on the page now, from which the request and the placement of
/// errors are derived.
#[derive(Clone, Copy)]
pub struct FormState {
    pub errors: RwSignal<Vec<FieldError>>,
    pub general: RwSignal<Option<String>>,
    pub busy: RwSignal<bool>,
    /// Paths of hand-written inputs (the sign-in form's token).
    fixed: &'static [&'static str],
    places: StoredValue<Vec<Place>>,
    next_key: StoredValue<u64>,
    /// The form's owner: items added later keep their values for the form's life, not
    /// for the life of the click handler that added them.
    owner: StoredValue<Option<Owner>>,
}

impl FormState {
    /// A form whose inputs are written by hand, at these paths.
    pub fn new(fixed: &'static [&'static str]) -> Self {
        Self {
            errors: RwSignal::new(Vec::new()),
            general: RwSignal::new(None),
            busy: RwSignal::new(false),
            fixed,
            places: StoredValue::new(Vec::new()),
            next_key: StoredValue::new(0),
            owner: StoredValue::new(Owner::current()),
        }
    }

    /// A form of declared fields; its own record holds their values.
    pub fn declared(fields: &[Field]) -> (Self, Record) {
        let form = Self::new(&[]);
        (form, Record::new(fields, Signal::stored(String::new())))
    }

    pub fn clear(&self) {
        self.errors.set(Vec::new());
        self.general.set(None);
    }

    /// Shows an error where it belongs: validation errors beside their inputs (see
    /// [`split_errors`]), anything else at the top.
    pub fn show(&self, error: ApiError) {
        let (beside, general) = split_errors(&self.place_paths(), error);
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

    fn place_paths(&self) -> Vec<String> {
        let mut paths: Vec<String> = self.fixed.iter().map(|p| (*p).to_owned()).collect();
        self.places
            .with_value(|places| paths.extend(places.iter().map(Place::path)));
        paths
    }

    /// The request as the inputs on the page say it now: a field that is not shown is not
    /// sent, so its default applies.
    pub fn request(&self) -> Value {
        let inputs: Vec<(String, Input)> = self.places.with_value(|places| {
            places
                .iter()
                .filter_map(|p| {
                    let (field, value) = p.value?;
                    Some((p.path(), field.input(value.get_untracked())))
                })
                .collect()
        });
        request(&inputs)
    }

    /// Adds a place for as long as the current component is on the page.
    fn mount(
        &self,
        record: Option<Record>,
        path: &'static str,
        value: Option<(Field, RwSignal<String>)>,
    ) {
        let key = self.next_key.get_value();
        self.next_key.set_value(key + 1);
        self.places.update_value(|places| {
            places.push(Place {
                key,
                record,
                path,
                value,
            })
        });
        let places = self.places;
        on_cleanup(move || {
            // The form may be gone first, when the whole page is.
            places.try_update_value(|places| places.retain(|p| p.key != key));
        });
    }

    fn with_owner<T>(&self, f: impl FnOnce() -> T) -> T {
        match self.owner.get_value() {
            Some(owner) => owner.with(f),
            None => f(),
        }
    }
}

/// A list of records in the request (`instance_groups`), each item of the same declared
/// fields; the page adds and removes items.
#[derive(Clone, Copy)]
pub struct List {
    pub path: &'static str,
    fields: &'static [Field],
    form: FormState,
    items: RwSignal<Vec<(u64, Record)>>,
    next_key: StoredValue<u64>,
}

impl List {
    /// A list with one item.
    pub fn new(form: FormState, path: &'static str, fields: &'static [Field]) -> Self {
        let list = Self {
            path,
            fields,
            form,
            items: RwSignal::new(Vec::new()),
            next_key: StoredValue::new(0),
        };
        list.add();
        list
    }

    /// Appends an item with its fields' defaults. Errors shown so far name items by
    /// index, so they are cleared rather than left beside the wrong item.
    pub fn add(&self) -> Record {
        let key = self.next_key.get_value();
        self.next_key.set_value(key + 1);
        let (items, path, fields) = (self.items, self.path, self.fields);
        let record = self.form.with_owner(|| {
            let at = Signal::derive(move || {
                let index = items.with(|i| i.iter().position(|(k, _)| *k == key));
                format!("{path}[{}]", index.unwrap_or_default())
            });
            Record::new(fields, at)
        });
        self.items.update(|i| i.push((key, record)));
        self.form.clear();
        record
    }

    /// Removes an item; the last one stays.
    pub fn remove(&self, key: u64) {
        if self.items.with_untracked(Vec::len) > 1 {
            self.form.clear();
            self.items.update(|i| i.retain(|(k, _)| *k != key));
        }
    }

    pub fn items(&self) -> Vec<(u64, Record)> {
        self.items.get()
    }

    pub fn len(&self) -> usize {
        self.items.with(Vec::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The item's position, from 0.
    pub fn index_of(&self, key: u64) -> usize {
        self.items
            .with(|i| i.iter().position(|(k, _)| *k == key))
            .unwrap_or_default()
    }

    /// Every item's value of one field (to suggest a name not taken yet).
    pub fn values_of(&self, field: &str) -> Vec<String> {
        self.items.with_untracked(|i| {
            i.iter()
                .map(|(_, r)| r.value(field).get_untracked())
                .collect()
        })
    }
}

/// Where errors about a list as a whole (`instance_groups`: none, too many) are shown.
#[component]
pub fn ListErrors(form: FormState, list: List) -> impl IntoView {
    form.mount(None, list.path, None);
    view! {
        <FieldErrors id=move || input_id(list.path) errors=move || form.errors_for(list.path)/>
    }
}

/// A declared field's input, labelled, with its hint and its errors, tied together for
/// screen readers (`aria-invalid`, `aria-describedby`). Selects take their `options`
/// (value, label) from the page, with `empty` labelling the empty choice.
#[component]
pub fn FieldInput(
    form: FormState,
    record: Record,
    field: &'static Field,
    #[prop(optional, into)] options: Option<Signal<Vec<(String, String)>>>,
    #[prop(optional, into)] empty: Option<String>,
) -> AnyView {
    let shown = move || {
        field
            .when
            .is_none_or(|(other, value)| record.value(other).with(|v| v == value))
    };
    let options = options.unwrap_or_else(|| Signal::stored(Vec::new()));
    // Erased once here, at the component's edge (the four kinds still branch with
    // `Either`): a page of many inputs otherwise nests past the compiler's type depth
    // limit in the server crate, which renders every page too.
    view! {
        <Show when=shown>
            <ShownField form record field options empty=empty.clone()/>
        </Show>
    }
    .into_any()
}

#[component]
fn ShownField(
    form: FormState,
    record: Record,
    field: &'static Field,
    options: Signal<Vec<(String, String)>>,
    empty: Option<String>,
) -> impl IntoView {
    let value = record.value(field.path);
    form.mount(Some(record), field.path, Some((*field, value)));
    // Closures over the form's own state, not signals of this input's: when an item of a
    // list is removed, its effects may run once more as it goes, and must find nothing
    // of its own disposed.
    let path = move || record.path(field.path);
    let id = move || input_id(&path());
    let errors = move || form.errors_for(&path());
    let invalid = move || !errors().is_empty();
    let aria_invalid = move || if invalid() { "true" } else { "false" };
    let described = move || format!("{0}-hint {0}-error", id());
    let hint = move || {
        field
            .hint
            .map(|h| view! { <p class="hint" id=move || format!("{}-hint", id())>{h}</p> })
    };
    match field.kind {
        Kind::Text | Kind::Integer => {
            let numeric = matches!(field.kind, Kind::Integer);
            EitherOf4::A(view! {
                <div class="field" class:invalid=invalid data-field=path>
                    <label for=id>
                        {field.label}
                        {(!field.required).then_some(view! { <span class="optional">" (optional)"</span> })}
                    </label>
                    <input
                        id=id
                        name=path
                        type=if numeric { "number" } else { "text" }
                        inputmode=numeric.then_some("numeric")
                        min=numeric.then_some("0")
                        autocomplete="off"
                        spellcheck="false"
                        placeholder=field.placeholder
                        aria-invalid=aria_invalid
                        aria-describedby=described
                        prop:value=move || value.get()
                        on:input=move |ev| value.set(event_target_value(&ev))
                    />
                    {hint}
                    <FieldErrors id errors/>
                </div>
            })
        }
        Kind::Flag => EitherOf4::B(view! {
            <div class="field check" class:invalid=invalid data-field=path>
                <input
                    id=id
                    name=path
                    type="checkbox"
                    aria-invalid=aria_invalid
                    aria-describedby=described
                    prop:checked=move || value.with(|v| v == "true")
                    on:change=move |ev| value.set(event_target_checked(&ev).to_string())
                />
                <label for=id>{field.label}</label>
                {hint}
                <FieldErrors id errors/>
            </div>
        }),
        Kind::Choice(choices) => EitherOf4::C(view! {
            <fieldset class="field choice" class:invalid=invalid data-field=path
                aria-describedby=move || format!("{}-error", id())>
                <legend>{field.label}</legend>
                {choices
                    .iter()
                    .map(|c| {
                        let option_id = move || format!("{}-{}", id(), c.value);
                        view! {
                            <div class="choice-option">
                                <input
                                    type="radio"
                                    id=option_id
                                    name=path
                                    value=c.value
                                    aria-describedby=move || format!("{}-hint", option_id())
                                    prop:checked=move || value.with(|v| v == c.value)
                                    on:change=move |_| value.set(c.value.to_owned())
                                />
                                <label for=option_id>{c.label}</label>
                                <p class="hint" id=move || format!("{}-hint", option_id())>{c.hint}</p>
                            </div>
                        }
                    })
                    .collect_view()}
                <FieldErrors id errors/>
            </fieldset>
        }),
        Kind::Select => EitherOf4::D(view! {
            <div class="field" class:invalid=invalid data-field=path>
                <label for=id>{field.label}</label>
                <select
                    id=id
                    name=path
                    aria-invalid=aria_invalid
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
                {hint}
                <FieldErrors id errors/>
            </div>
        }),
    }
}

#[component]
fn FieldErrors(
    id: impl Fn() -> String + Copy + Send + Sync + 'static,
    errors: impl Fn() -> Vec<String> + Copy + Send + Sync + 'static,
) -> impl IntoView {
    view! {
        <div class="field-error" id=move || format!("{}-error", id()) role="alert" aria-live="polite">
            <For each=errors key=|m| m.clone() let:m>
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
    fn paths_read_as_keys_and_indexes() {
        use Step::{Index, Key};
        assert_eq!(
            steps("instance_groups[12].capacity.type"),
            Some(vec![
                Key("instance_groups"),
                Index(12),
                Key("capacity"),
                Key("type")
            ])
        );
        assert_eq!(steps("name"), Some(vec![Key("name")]));
        assert_eq!(steps("m[0][1]"), Some(vec![Key("m"), Index(0), Index(1)]));
        for bad in ["", "a..b", "a[x]", "a[1", "a[1]b", ".a", "[0]"] {
            assert_eq!(steps(bad), None, "{bad}");
        }
    }

    #[test]
    fn inputs_become_typed_and_nested_json() {
        let v = request(&[
            ("name", Input::Text("ml-1".into())),
            (
                "instance_groups[0].instance_count",
                Input::Integer(" 4 ".into()),
            ),
            ("instance_groups[0].efa_only", Input::Flag(true)),
            ("network.vpc_cidr", Input::Text("10.3.0.0/16".into())),
            ("network.vpc_id", Input::Text(String::new())),
            (
                "instance_groups[0].capacity.type",
                Input::Text("spot".into()),
            ),
            ("instance_groups[1].name", Input::Text("second".into())),
            ("kubernetes_version", Input::Integer(String::new())),
        ]);
        assert_eq!(
            v,
            json!({
                "name": "ml-1",
                "network": { "vpc_cidr": "10.3.0.0/16" },
                "instance_groups": [
                    { "instance_count": 4, "efa_only": true, "capacity": { "type": "spot" } },
                    { "name": "second" },
                ],
            })
        );
        assert_eq!(
            request(&[
                ("rate", Input::Number(" 0.25 ".into())),
                ("whole", Input::Number("3".into())),
                ("nan", Input::Number("NaN".into())),
            ]),
            json!({ "rate": 0.25, "whole": 3, "nan": "NaN" })
        );
        assert_eq!(
            request(&[("count", Input::Integer("two".into()))]),
            json!({ "count": "two" })
        );
        // An item named before those ahead of it: they are there, empty.
        assert_eq!(
            request(&[("groups[2].name", Input::Text("c".into()))]),
            json!({ "groups": [{}, {}, { "name": "c" }] })
        );
        // A path at odds with an earlier one does not overwrite it.
        assert_eq!(
            request(&[
                ("a.b", Input::Text("x".into())),
                ("a[0].c", Input::Text("y".into()))
            ]),
            json!({ "a": { "b": "x" } })
        );
        assert_eq!(input_id("network.vpc_cidr"), "network-vpc_cidr");
        assert_eq!(
            input_id("instance_groups[1].capacity.type"),
            "instance_groups-1-capacity-type"
        );
    }

    #[test]
    fn empty_optional_inputs_are_left_out() {
        let v = request(&[
            ("name", Input::Text(" ml-1 ".into())),
            ("region", Input::Text(String::new())),
        ]);
        assert_eq!(v, json!({ "name": "ml-1" }));
    }

    #[test]
    fn the_import_form_checks_every_field_it_has() {
        use crate::api::clusters::ImportCluster;
        let input = request(&[
            ("name", Input::Text("e2e-eks".into())),
            ("region", Input::Text("us-east-1".into())),
            ("hyperpod_cluster", Input::Text(String::new())),
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

    /// The create form's inputs with one group, as paths and values.
    fn create_inputs() -> Vec<(String, Input)> {
        [
            ("name", Input::Text("ml-1".into())),
            ("availability_zone", Input::Text("us-east-1a".into())),
            (
                "instance_groups[0].name",
                Input::Text("accelerated-1".into()),
            ),
            (
                "instance_groups[0].instance_type",
                Input::Text("ml.g5.8xlarge".into()),
            ),
            (
                "instance_groups[0].instance_count",
                Input::Integer("2".into()),
            ),
            (
                "instance_groups[0].capacity.type",
                Input::Text("on_demand".into()),
            ),
            ("instance_groups[0].efa_only", Input::Flag(false)),
            ("instance_groups[0].deep_health_checks", Input::Flag(false)),
            (
                "instance_groups[0].volume_size_gb",
                Input::Integer("500".into()),
            ),
        ]
        .map(|(p, i)| (p.to_owned(), i))
        .to_vec()
    }

    fn with(mut inputs: Vec<(String, Input)>, path: &str, input: Input) -> Vec<(String, Input)> {
        inputs.retain(|(p, _)| p != path);
        inputs.push((path.to_owned(), input));
        inputs
    }

    /// A second group, copied from the first under another name.
    fn two_groups() -> Vec<(String, Input)> {
        let mut inputs = create_inputs();
        let second: Vec<(String, Input)> = inputs
            .iter()
            .filter_map(|(p, i)| {
                let rest = p.strip_prefix("instance_groups[0].")?;
                Some((format!("instance_groups[1].{rest}"), i.clone()))
            })
            .collect();
        inputs.extend(second);
        with(
            inputs,
            "instance_groups[1].name",
            Input::Text("accelerated-2".into()),
        )
    }

    #[test]
    fn the_create_form_checks_every_field_it_has() {
        use crate::api::clusters::CreateCluster;
        let ok = check::<CreateCluster>(request(&create_inputs())).unwrap();
        assert_eq!(ok.instance_groups.len(), 1);
        assert_eq!(ok.instance_groups[0].instance_count.get(), 2);
        assert_eq!(ok.instance_groups[0].volume_size_gb.get(), 500);
        let ok = check::<CreateCluster>(request(&two_groups())).unwrap();
        assert_eq!(ok.instance_groups[1].name.as_str(), "accelerated-2");
        // No instance at all is the first group's count's problem.
        let none = with(
            create_inputs(),
            "instance_groups[0].instance_count",
            Input::Integer("0".into()),
        );
        let err = check::<CreateCluster>(request(&none)).unwrap_err();
        assert_eq!(err.errors_for("instance_groups[0].instance_count").len(), 1);
        // Each bad value is named by the path its input carries, in either group.
        for (field, input) in [
            (
                "instance_groups[0].instance_count",
                Input::Integer("-1".into()),
            ),
            (
                "instance_groups[1].instance_count",
                Input::Integer("two".into()),
            ),
            (
                "instance_groups[1].name",
                Input::Text("accelerated-1".into()),
            ),
            ("instance_groups[1].name", Input::Text("no spaces".into())),
            ("instance_groups[0].name", Input::Text(String::new())),
            (
                "instance_groups[1].instance_type",
                Input::Text("p5.48xlarge".into()),
            ),
            ("instance_groups[1].efa_only", Input::Flag(true)),
            (
                "instance_groups[1].volume_size_gb",
                Input::Integer("0".into()),
            ),
            ("network.vpc_cidr", Input::Text("10.0.0.0/8".into())),
            ("network.vpc_cidr", Input::Text("10.0.0.0/20".into())),
            ("network.vpc_id", Input::Text("vpc-nope".into())),
            ("storage.s3_bucket", Input::Text("Bad_Bucket".into())),
            ("kubernetes_version", Input::Text("2.0".into())),
        ] {
            let inputs = with(two_groups(), field, input);
            let err = check::<CreateCluster>(request(&inputs)).unwrap_err();
            assert_eq!(err.errors_for(field).len(), 1, "{field}: {err:?}");
            let places: Vec<String> = inputs.iter().map(|(p, _)| p.clone()).collect();
            let (beside, general) = split_errors(&places, err);
            assert_eq!(beside.len(), 1, "{field}");
            assert_eq!(beside[0].field, field);
            assert!(general.is_none(), "{field}: {general:?}");
        }
        // A bad training plan is the capacity's error, shown beside the capacity choice.
        let inputs = with(
            with(
                two_groups(),
                "instance_groups[1].capacity.type",
                Input::Text("training_plan".into()),
            ),
            "instance_groups[1].capacity.training_plan_arn",
            Input::Text("arn:nope".into()),
        );
        let err = check::<CreateCluster>(request(&inputs)).unwrap_err();
        let places: Vec<String> = inputs.iter().map(|(p, _)| p.clone()).collect();
        let (beside, general) = split_errors(&places, err);
        assert!(general.is_none(), "{general:?}");
        assert!(
            beside[0].field.starts_with("instance_groups[1].capacity"),
            "{beside:?}"
        );
        let err = check::<CreateCluster>(json!({})).unwrap_err();
        assert_eq!(err.errors_for("name"), vec!["required"]);
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

    #[test]
    fn an_error_about_an_object_or_list_goes_to_its_own_place_or_its_first_input() {
        let places = [
            "instance_groups",
            "instance_groups[0].name",
            "instance_groups[0].capacity.type",
            "instance_groups[0].capacity.training_plan_arn",
            "instance_groups[10].name",
        ];
        let error = ApiError::Validation {
            errors: vec![
                FieldError::new("instance_groups", "at least one"),
                FieldError::new("instance_groups[0].capacity", "unknown variant"),
                FieldError::new("instance_groups[1]", "not in the form"),
                FieldError::new("instance_groups[1", "malformed path"),
            ],
        };
        let (beside, general) = split_errors(&places, error);
        assert_eq!(
            beside,
            vec![
                FieldError::new("instance_groups", "at least one"),
                FieldError::new("instance_groups[0].capacity.type", "unknown variant"),
            ]
        );
        // `instance_groups[10]` is not inside `instance_groups[1]`, nor `[1` a path.
        assert_eq!(
            general.as_deref(),
            Some("instance_groups[1]: not in the form; instance_groups[1: malformed path")
        );
        assert!(within("a[0].b", "a") && within("a[0].b", "a[0]") && within("a.b", "a"));
        assert!(!within("ab", "a") && !within("a", "a") && !within("a[10]", "a[1]"));
    }

    #[test]
    fn declared_fields_say_what_json_their_text_is() {
        let count = Field::integer("instance_count", "Count").default("1");
        assert_eq!(count.input("3".into()), Input::Integer("3".into()));
        assert_eq!(count.default, "1");
        let efa = Field::flag("efa_only", "EFA-only");
        assert_eq!(efa.default, "false");
        assert_eq!(efa.input("true".into()), Input::Flag(true));
        assert_eq!(efa.input("false".into()), Input::Flag(false));
        let plan = Field::text("capacity.training_plan_arn", "Plan")
            .required()
            .when("capacity.type", "training_plan");
        assert!(plan.required);
        assert_eq!(plan.when, Some(("capacity.type", "training_plan")));
        assert_eq!(plan.input("x".into()), Input::Text("x".into()));
    }

    #[test]
    fn a_form_sends_what_is_on_it_and_places_errors_by_path() {
        let owner = Owner::new();
        owner.set();
        const FIELDS: &[Field] = &[Field::text("name", "Name").required()];
        const ITEM: &[Field] = &[
            Field::text("name", "Group").required(),
            Field::integer("count", "Count").default("1"),
        ];
        let (form, top) = FormState::declared(FIELDS);
        let list = List::new(form, "groups", ITEM);
        top.value("name").set("ml-1".into());
        let second = list.add();
        second.value("name").set("b".into());
        // Nothing is mounted yet: nothing is sent.
        assert_eq!(form.request(), json!({}));
        let child = owner.child();
        child.with(|| {
            form.mount(Some(top), "name", Some((FIELDS[0], top.value("name"))));
            for (_, record) in list.items() {
                for field in ITEM {
                    form.mount(
                        Some(record),
                        field.path,
                        Some((*field, record.value(field.path))),
                    );
                }
            }
        });
        assert_eq!(
            form.request(),
            json!({ "name": "ml-1", "groups": [{ "count": 1 }, { "name": "b", "count": 1 }] })
        );
        assert_eq!(list.values_of("name"), vec![String::new(), "b".to_owned()]);
        // Removing the first item renumbers the second: its errors' path follows.
        list.remove(list.items()[0].0);
        assert_eq!(second.path("name"), "groups[0].name");
        form.show(ApiError::field("groups[0].name", "taken"));
        assert_eq!(form.errors_for("groups[0].name"), vec!["taken"]);
        // The last item stays.
        list.remove(list.items()[0].0);
        assert_eq!(list.len(), 1);
        // Unmounted inputs are neither sent nor places for errors.
        child.cleanup();
        assert_eq!(form.request(), json!({}));
        form.show(ApiError::field("name", "taken"));
        assert_eq!(form.general.get(), Some("name: taken".to_owned()));
    }
}
