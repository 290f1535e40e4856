//! CRD `openAPIV3Schema` validation, defaulting and pruning, for the structural-schema
//! subset CRDs use (types, properties, required, enum, bounds, patterns, items,
//! additionalProperties, `x-kubernetes-int-or-string`, `x-kubernetes-preserve-unknown-
//! fields`) plus the CEL rules of `x-kubernetes-validations` written with `has()`, `!`,
//! `&&`, `||`, `in [..]`, `==` against literals and `self == oldSelf`. Messages follow
//! the API server's wording, because clients (and people) match on them.

use regex::Regex;
use serde_json::{Map, Value};

#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub field: String,
    /// `Invalid value: "string": ...`, `Required value`, ...
    pub message: String,
    pub reason: &'static str,
}

impl FieldError {
    pub fn render(&self) -> String {
        format!("{}: {}", self.field, self.message)
    }
}

#[derive(Default)]
pub struct Outcome {
    pub errors: Vec<FieldError>,
    /// Fields the schema does not declare (pruned; an error under fieldValidation=Strict).
    pub unknown: Vec<String>,
}

/// Validates `obj` (a whole custom resource) in place: defaults are filled in and unknown
/// fields pruned. `old` is the stored object on update (for transition rules).
pub fn validate(schema: &Value, obj: &mut Value, old: Option<&Value>) -> Outcome {
    let mut out = Outcome::default();
    let Some(o) = obj.as_object_mut() else {
        out.errors.push(FieldError {
            field: "<root>".into(),
            message: "Invalid value: must be an object".into(),
            reason: "FieldValueInvalid",
        });
        return out;
    };
    let props = schema["properties"].as_object();
    let keys: Vec<String> = o.keys().cloned().collect();
    for k in keys {
        if ["apiVersion", "kind", "metadata"].contains(&k.as_str()) {
            continue;
        }
        match props.and_then(|p| p.get(&k)) {
            Some(s) => {
                let old_child = old.and_then(|v| v.get(&k));
                if let Some(child) = o.get_mut(&k) {
                    check(s, child, old_child, &k, &mut out);
                }
            }
            None if schema["x-kubernetes-preserve-unknown-fields"] == Value::Bool(true) => {}
            None => {
                out.unknown.push(k.clone());
                o.remove(&k);
            }
        }
    }
    apply_defaults(schema, o);
    out
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

fn invalid(out: &mut Outcome, path: &str, v: &Value, detail: String) {
    out.errors.push(FieldError {
        field: path.to_owned(),
        message: format!("Invalid value: {}: {detail}", shown(v)),
        reason: "FieldValueInvalid",
    });
}

fn apply_defaults(schema: &Value, o: &mut Map<String, Value>) {
    let Some(props) = schema["properties"].as_object() else {
        return;
    };
    for (k, s) in props {
        if !o.contains_key(k)
            && let Some(d) = s.get("default")
        {
            o.insert(k.clone(), d.clone());
        }
    }
}

fn check(schema: &Value, v: &mut Value, old: Option<&Value>, path: &str, out: &mut Outcome) {
    // Nulls are accepted for nullable fields and dropped by the server otherwise.
    if v.is_null() {
        return;
    }
    let int_or_string = schema["x-kubernetes-int-or-string"] == Value::Bool(true);
    let actual = type_name(v);
    if int_or_string {
        if !matches!(actual, "integer" | "string") {
            invalid(
                out,
                path,
                &Value::String(actual.into()),
                format!("{path} in body must be of type integer or string: {actual:?}"),
            );
            return;
        }
    } else if let Some(want) = schema["type"].as_str() {
        let ok = want == actual || (want == "number" && actual == "integer");
        if !ok {
            invalid(
                out,
                path,
                &Value::String(actual.into()),
                format!("{path} in body must be of type {want}: {actual:?}"),
            );
            return;
        }
    }
    if let Some(options) = schema["enum"].as_array()
        && !options.contains(v)
    {
        let list: Vec<String> = options.iter().map(shown).collect();
        out.errors.push(FieldError {
            field: path.to_owned(),
            message: format!(
                "Unsupported value: {}: supported values: {}",
                shown(v),
                list.join(", ")
            ),
            reason: "FieldValueNotSupported",
        });
    }
    if let Value::Number(n) = &*v {
        let x = n.as_f64().unwrap_or_default();
        if let Some(min) = schema["minimum"].as_f64() {
            let excl = schema["exclusiveMinimum"] == Value::Bool(true);
            if x < min || (excl && x == min) {
                invalid(
                    out,
                    path,
                    v,
                    format!("{path} in body should be greater than or equal to {min}"),
                );
            }
        }
        if let Some(max) = schema["maximum"].as_f64() {
            let excl = schema["exclusiveMaximum"] == Value::Bool(true);
            if x > max || (excl && x == max) {
                invalid(
                    out,
                    path,
                    v,
                    format!("{path} in body should be less than or equal to {max}"),
                );
            }
        }
    }
    if let Value::String(s) = &*v {
        let len = s.chars().count() as u64;
        if let Some(min) = schema["minLength"].as_u64()
            && len < min
        {
            invalid(
                out,
                path,
                v,
                format!("{path} in body should be at least {min} chars long"),
            );
        }
        if let Some(max) = schema["maxLength"].as_u64()
            && len > max
        {
            out.errors.push(FieldError {
                field: path.to_owned(),
                message: format!("Too long: may not be more than {max} bytes"),
                reason: "FieldValueTooLong",
            });
        }
        if let Some(p) = schema["pattern"].as_str()
            && let Ok(re) = Regex::new(p)
            && !re.is_match(s)
        {
            invalid(out, path, v, format!("{path} in body should match '{p}'"));
        }
    }
    match v {
        Value::Array(items) => {
            let n = items.len() as u64;
            if let Some(min) = schema["minItems"].as_u64()
                && n < min
            {
                invalid(
                    out,
                    path,
                    &Value::Number(n.into()),
                    format!("{path} in body should have at least {min} items"),
                );
            }
            if let Some(max) = schema["maxItems"].as_u64()
                && n > max
            {
                out.errors.push(FieldError {
                    field: path.to_owned(),
                    message: format!("Too many: {n}: must have at most {max} items"),
                    reason: "FieldValueTooMany",
                });
            }
            if schema["items"].is_object() {
                for (i, item) in items.iter_mut().enumerate() {
                    check(&schema["items"], item, None, &format!("{path}[{i}]"), out);
                }
            }
        }
        Value::Object(o) => {
            let preserve = schema["x-kubernetes-preserve-unknown-fields"] == Value::Bool(true);
            let props = schema["properties"].as_object();
            let additional = &schema["additionalProperties"];
            // Defaults are applied while decoding, before validation.
            apply_defaults(schema, o);
            if let Some(required) = schema["required"].as_array() {
                for r in required.iter().filter_map(Value::as_str) {
                    if !o.contains_key(r) {
                        out.errors.push(FieldError {
                            field: format!("{path}.{r}"),
                            message: "Required value".into(),
                            reason: "FieldValueRequired",
                        });
                    }
                }
            }
            let keys: Vec<String> = o.keys().cloned().collect();
            for k in keys {
                let child_path = format!("{path}.{k}");
                let sub = props.and_then(|p| p.get(&k)).or(if additional.is_object() {
                    Some(additional)
                } else {
                    None
                });
                match sub {
                    Some(s) => {
                        let old_child = old.and_then(|x| x.get(&k));
                        if let Some(child) = o.get_mut(&k) {
                            check(s, child, old_child, &child_path, out);
                        }
                    }
                    // Schemas without properties (free-form maps) and embedded
                    // resources' identity fields keep what they are given.
                    None if preserve
                        || additional == &Value::Bool(true)
                        || (props.is_none() && !additional.is_object())
                        || (schema["x-kubernetes-embedded-resource"] == Value::Bool(true)
                            && ["apiVersion", "kind", "metadata"].contains(&k.as_str())) => {}
                    None => {
                        out.unknown.push(child_path);
                        o.remove(&k);
                    }
                }
            }
        }
        _ => {}
    }
    if let Some(rules) = schema["x-kubernetes-validations"].as_array() {
        for rule in rules {
            let Some(expr) = rule["rule"].as_str() else {
                continue;
            };
            if let Some(false) = cel::eval(expr, v, old) {
                let message = rule["message"]
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| format!("failed rule: {expr}"));
                invalid(out, path, &Value::String(type_name(v).into()), message);
            }
        }
    }
}

/// The few CEL forms CRD authors use for structural rules. Anything else evaluates to
/// `None` and the rule is not enforced (the emulator never rejects on a guess).
mod cel {
    use serde_json::Value;

    #[derive(Debug, Clone, PartialEq)]
    enum Tok {
        Ident(String),
        Str(String),
        Num(f64),
        Sym(&'static str),
    }

    fn lex(s: &str) -> Option<Vec<Tok>> {
        let mut out = Vec::new();
        let cs: Vec<char> = s.chars().collect();
        let mut i = 0;
        while i < cs.len() {
            let c = cs[i];
            if c.is_whitespace() {
                i += 1;
            } else if c.is_alphabetic() || c == '_' {
                let start = i;
                while i < cs.len() && (cs[i].is_alphanumeric() || cs[i] == '_') {
                    i += 1;
                }
                out.push(Tok::Ident(cs[start..i].iter().collect()));
            } else if c.is_ascii_digit() {
                let start = i;
                while i < cs.len() && (cs[i].is_ascii_digit() || cs[i] == '.') {
                    i += 1;
                }
                out.push(Tok::Num(
                    cs[start..i].iter().collect::<String>().parse().ok()?,
                ));
            } else if c == '\'' || c == '"' {
                let start = i + 1;
                i += 1;
                while i < cs.len() && cs[i] != c {
                    i += 1;
                }
                out.push(Tok::Str(cs.get(start..i)?.iter().collect()));
                i += 1;
            } else {
                let two: String = cs[i..(i + 2).min(cs.len())].iter().collect();
                let sym = match two.as_str() {
                    "&&" => Some("&&"),
                    "||" => Some("||"),
                    "==" => Some("=="),
                    "!=" => Some("!="),
                    _ => None,
                };
                if let Some(s) = sym {
                    out.push(Tok::Sym(s));
                    i += 2;
                    continue;
                }
                out.push(Tok::Sym(match c {
                    '!' => "!",
                    '(' => "(",
                    ')' => ")",
                    '[' => "[",
                    ']' => "]",
                    ',' => ",",
                    '.' => ".",
                    _ => return None,
                }));
                i += 1;
            }
        }
        Some(out)
    }

    struct P<'a> {
        t: Vec<Tok>,
        i: usize,
        this: &'a Value,
        old: Option<&'a Value>,
    }

    enum Val {
        V(Value),
        Missing,
    }

    impl P<'_> {
        fn peek(&self) -> Option<&Tok> {
            self.t.get(self.i)
        }
        fn eat(&mut self, s: &str) -> bool {
            if self.peek()
                == Some(&Tok::Sym(match s {
                    "&&" => "&&",
                    "||" => "||",
                    "!" => "!",
                    "(" => "(",
                    ")" => ")",
                    "[" => "[",
                    "]" => "]",
                    "," => ",",
                    "." => ".",
                    "==" => "==",
                    "!=" => "!=",
                    _ => return false,
                }))
            {
                self.i += 1;
                true
            } else {
                false
            }
        }
        fn or(&mut self) -> Option<bool> {
            let mut v = self.and()?;
            while self.eat("||") {
                let r = self.and()?;
                v = v || r;
            }
            Some(v)
        }
        fn and(&mut self) -> Option<bool> {
            let mut v = self.unary()?;
            while self.eat("&&") {
                let r = self.unary()?;
                v = v && r;
            }
            Some(v)
        }
        fn unary(&mut self) -> Option<bool> {
            if self.eat("!") {
                return Some(!self.unary()?);
            }
            if self.eat("(") {
                let v = self.or()?;
                return self.eat(")").then_some(v);
            }
            if self.peek() == Some(&Tok::Ident("has".into())) {
                self.i += 1;
                if !self.eat("(") {
                    return None;
                }
                let v = self.operand()?;
                if !self.eat(")") {
                    return None;
                }
                return Some(matches!(v, Val::V(_)));
            }
            let left = self.operand()?;
            if self.eat("==") {
                let right = self.operand()?;
                return Some(match (left, right) {
                    (Val::V(a), Val::V(b)) => a == b,
                    _ => false,
                });
            }
            if self.eat("!=") {
                let right = self.operand()?;
                return Some(match (left, right) {
                    (Val::V(a), Val::V(b)) => a != b,
                    _ => true,
                });
            }
            if self.peek() == Some(&Tok::Ident("in".into())) {
                self.i += 1;
                if !self.eat("[") {
                    return None;
                }
                let mut items = Vec::new();
                while !self.eat("]") {
                    match self.operand()? {
                        Val::V(v) => items.push(v),
                        Val::Missing => return None,
                    }
                    self.eat(",");
                }
                return Some(matches!(left, Val::V(v) if items.contains(&v)));
            }
            match left {
                Val::V(Value::Bool(b)) => Some(b),
                _ => None,
            }
        }
        fn operand(&mut self) -> Option<Val> {
            match self.peek()?.clone() {
                Tok::Str(s) => {
                    self.i += 1;
                    Some(Val::V(Value::String(s)))
                }
                Tok::Num(n) => {
                    self.i += 1;
                    Some(Val::V(serde_json::Number::from_f64(n).map(Value::Number)?))
                }
                Tok::Ident(id) => {
                    self.i += 1;
                    let mut cur = match id.as_str() {
                        "self" => Val::V(self.this.clone()),
                        // On create there is no old object; transition rules hold.
                        "oldSelf" => match self.old {
                            Some(o) => Val::V(o.clone()),
                            None => Val::V(self.this.clone()),
                        },
                        "true" => Val::V(Value::Bool(true)),
                        "false" => Val::V(Value::Bool(false)),
                        _ => return None,
                    };
                    while self.eat(".") {
                        let Some(Tok::Ident(field)) = self.peek().cloned() else {
                            return None;
                        };
                        self.i += 1;
                        cur = match cur {
                            Val::V(v) => v.get(&field).cloned().map_or(Val::Missing, Val::V),
                            Val::Missing => Val::Missing,
                        };
                    }
                    Some(cur)
                }
                Tok::Sym(_) => None,
            }
        }
    }

    pub fn eval(expr: &str, this: &Value, old: Option<&Value>) -> Option<bool> {
        let mut p = P {
            t: lex(expr)?,
            i: 0,
            this,
            old,
        };
        let v = p.or()?;
        (p.i == p.t.len()).then_some(v)
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use serde_json::json;

        #[test]
        fn evaluates_the_rules_crds_use() {
            let v = json!({"jobStatus": "FAILED"});
            assert_eq!(
                eval(
                    "has(self.jobStatus) || has(self.jobDeploymentStatus)",
                    &v,
                    None
                ),
                Some(true)
            );
            assert_eq!(
                eval(
                    "!(has(self.jobStatus) && has(self.jobDeploymentStatus))",
                    &v,
                    None
                ),
                Some(true)
            );
            assert_eq!(eval("has(self.onSuccess)", &v, None), Some(false));
            assert_eq!(eval("self in ['a', 'b']", &json!("c"), None), Some(false));
            assert_eq!(
                eval("self == oldSelf", &json!("c"), Some(&json!("d"))),
                Some(false)
            );
            assert_eq!(eval("self.x.map(y, y > 1)", &v, None), None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reports_types_enums_required_and_prunes_unknown_fields() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "required": ["entrypoint"],
            "properties": {"entrypoint": {"type": "string"}, "policy": {"type": "string", "enum": ["A", "B"]},
                           "ttl": {"type": "integer", "minimum": 0, "default": 0},
                           "port": {"x-kubernetes-int-or-string": true}}}}});
        let mut obj = json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "n"},
            "spec": {"policy": "C", "extra": 1, "port": "http"}});
        let out = validate(&schema, &mut obj, None);
        let msgs: Vec<String> = out.errors.iter().map(FieldError::render).collect();
        assert_eq!(
            msgs,
            vec![
                "spec.entrypoint: Required value".to_owned(),
                "spec.policy: Unsupported value: \"C\": supported values: \"A\", \"B\"".to_owned()
            ]
        );
        assert_eq!(out.unknown, vec!["spec.extra"]);
        assert!(obj["spec"].get("extra").is_none());
        assert_eq!(obj["spec"]["ttl"], 0);
        let mut bad = json!({"spec": {"entrypoint": 3}});
        let out = validate(&schema, &mut bad, None);
        assert_eq!(
            out.errors[0].render(),
            "spec.entrypoint: Invalid value: \"integer\": spec.entrypoint in body must be of type string: \"integer\""
        );
    }
}
